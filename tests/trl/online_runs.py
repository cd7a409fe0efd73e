"""GRPO / RLOO runs for the parity tests: plain TRL trainer vs its ORT counterpart from the same
seed, on the tiny chat model of trl_runs, with a reward function that records the
completion tokens it scores (the sampled tokens, compared run to run)."""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl_runs import (
    assert_ort_trained_on_used_rows,
    assert_same_logs,
    build_model,
    build_tokenizer,
    common_args,
    lora_config,
    weights,
)

STEPS = 6
PROMPTS = 16


def prompts() -> Dataset:
    return Dataset.from_dict({"prompt": [f"Say a word with {i} letters:" for i in range(PROMPTS)]})


class LetterReward:
    """The share of a completion's characters that are letters (readable, and far from saturating
    for a model this small). Records the completion tokens of every call: what was sampled."""

    def __init__(self):
        self.__name__ = "letters"  # TRL logs rewards/<name>/mean
        self.sampled: list[list[list[int]]] = []

    def __call__(self, completions, completion_ids, **kwargs):
        self.sampled.append([list(ids) for ids in completion_ids])
        return [sum(c.isalpha() for c in text) / max(len(text), 1) for text in completions]


def reward_model(tokenizer, seed: int = 2):
    """A sequence-classification reward model (1 label), built in code like the policy."""
    import transformers

    config = build_model(tokenizer).config
    config.num_labels = 1
    torch.manual_seed(seed)
    return transformers.Qwen2ForSequenceClassification(config).eval()


class WeightsAtGeneration(TrainerCallback):
    """Records the policy's weights after every optimizer step, and the ones ``generate`` reads
    each time it is called (wrapping ``trainer.model.generate``), with the step they belong to."""

    def __init__(self):
        self.after_step: dict[int, dict] = {}
        self.at_generation: list[tuple[int, dict, set]] = []

    def attach(self, trainer) -> None:
        model, generate = trainer.model, trainer.model.generate

        def recording_generate(*args, **kwargs):
            params = dict(model.named_parameters())
            self.at_generation.append(
                (
                    trainer.state.global_step,
                    {n: p.detach().clone() for n, p in params.items()},
                    {p.data_ptr() for p in params.values()},
                )
            )
            return generate(*args, **kwargs)

        model.generate = recording_generate

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after_step[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}


def train(
    trl_trainer,
    trl_config,
    ort_trainer,
    ort_config,
    out,
    ort: bool,
    lora: bool,
    with_reward_model=False,
    watch: TrainerCallback | None = None,
    initializer_range: float = 0.02,
    family: str = "qwen2",
    **options,
):
    """One run; returns the trainer and its LetterReward. ``watch``, a callback with ``attach(trainer)``,
    records what the test asks (``WeightsAtGeneration``: the weights generation reads). A full fine-tune
    with ``beta > 0`` needs the policy on disk: TRL loads the reference model from the policy's
    ``name_or_path``."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, family=family, initializer_range=initializer_range)
    model.save_pretrained(out / "policy")
    model.config._name_or_path = str(out / "policy")
    reward = LetterReward()
    reward_funcs = [reward, reward_model(tokenizer)] if with_reward_model else [reward]
    args = {**common_args(out, lora, max_completion_length=8, **options), "max_steps": STEPS}
    config = ort_config(ort_fallback="disable", ort_log_level="ERROR", **args) if ort else trl_config(**args)
    trainer = (ort_trainer if ort else trl_trainer)(
        model,
        reward_funcs,
        config,
        train_dataset=prompts(),
        processing_class=tokenizer,
        reward_processing_classes=[None, tokenizer] if with_reward_model else None,
        peft_config=lora_config(family) if lora else None,
        callbacks=[watch] if watch else None,
    )
    if watch:
        watch.attach(trainer)
    trainer.train()
    return trainer, reward


def assert_same_online_run(reference, ours, keys, weights_atol: float | None = None) -> None:
    """ORT trained (on the completion rows), the same tokens were sampled every step, and the logs
    (within 1e-4) and final weights (1e-4 relative, ``weights_atol`` absolute) are the plain trainer's.

    ``weights_atol`` defaults to 5% of one Adam step (the learning rate). Adam moves a weight by about
    lr * g / (|g| + 1e-8), so a gradient near 1e-8 (a sum that nearly cancels) moves it by a share of
    lr that float32 noise in g decides: a 2.3e-9 difference on a gradient of 5e-8 moved a weight by
    1.1e-5 over the 6 steps at lr 1e-3. Over seeds 0-3 of the full two-iteration RLOO run, weights
    differed by up to 1.55e-5 beyond the relative tolerance, with either attention path
    (``ort_cpu_flash_attention``).
    A wrong gradient moves weights by whole steps."""
    (theirs, their_reward), (trainer, our_reward) = reference, ours
    assert_ort_trained_on_used_rows(trainer)
    # one generation per num_iterations steps (each scored once by the reward function)
    assert len(their_reward.sampled) == STEPS // theirs.args.num_iterations, len(their_reward.sampled)
    assert our_reward.sampled == their_reward.sampled, "different tokens sampled"
    # rewards and completion lengths are logged on the steps that generate (every num_iterations-th)
    rows = [[{k: h[k] for k in keys if k in h} for h in t.state.log_history if "loss" in h] for t in (theirs, trainer)]
    assert len(rows[0]) == len(rows[1]) == STEPS
    assert [r.keys() for r in rows[0]] == [r.keys() for r in rows[1]]
    assert set(keys) == {k for r in rows[0] for k in r}, "a compared metric was never logged"
    assert_same_logs(*rows)
    final, expected = weights(trainer.model), weights(theirs.model)
    if weights_atol is None:
        weights_atol = 0.05 * theirs.args.learning_rate
    for key, value in expected.items():
        torch.testing.assert_close(
            final[key], value, rtol=1e-4, atol=weights_atol, msg=lambda m, key=key: f"{key}: {m}"
        )
