"""ORTGRPOTrainer against GRPOTrainer from the same seed: the same completion tokens sampled at
every step, and per-step loss, reward, reward_std, kl (beta > 0), completion lengths, entropy and
clip ratios within 1e-4 over 6 steps, final weights alike; full fine-tune and LoRA, several
generations per prompt, loss types dapo (TRL's default) and grpo, num_iterations 2 (old-policy
log-probabilities), a reward function and a reward model. ORT proven to have trained, and
generation after optimizer step k proven to read the weights of step k."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")

from online_runs import WeightsAtGeneration, assert_same_online_run, train  # noqa: E402

from ort_hf.trl import ORTGRPOConfig, ORTGRPOTrainer  # noqa: E402

KEYS = (
    "loss",
    "reward",
    "reward_std",
    "kl",
    "completions/mean_length",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "rewards/letters/mean",
    "num_tokens",
)

# name -> (LoRA, reward model too, GRPOConfig options). epsilon small with num_iterations 2, so the
# second pass over a generation clips some tokens and clip_ratio compares non-zero values. Gemma2 (tied
# embeddings, final-logit soft-capping in TRL's head and in generate, sliding window): another family.
CONFIGS = {
    "full-dapo-2-iterations": (False, False, dict(num_generations=2, beta=0.1, num_iterations=2, epsilon=0.02)),
    "lora-grpo-reward-model": (True, True, dict(num_generations=4, beta=0.1, loss_type="grpo")),
    "lora-gemma2": (True, False, dict(num_generations=4, beta=0.1, family="gemma2")),
}


def _train(name, out, ort: bool, watch=None):
    lora, with_reward_model, options = CONFIGS[name]
    return train(
        trl.GRPOTrainer,
        trl.GRPOConfig,
        ORTGRPOTrainer,
        ORTGRPOConfig,
        out,
        ort,
        lora,
        with_reward_model,
        watch=watch,
        **options,
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_grpo_through_ort_equals_grpo_trainer(name, tmp_path):
    reference = _train(name, tmp_path / "pt", ort=False)
    watch = WeightsAtGeneration()
    ours = _train(name, tmp_path / "ort", ort=True, watch=watch)
    assert_same_online_run(reference, ours, KEYS)
    # Generation reads the very tensors the ORT session trains, as the optimizer left them.
    trainer = ours[0]
    trained = {p.data_ptr() for p in trainer.ort_engine.parameters()}
    later = [(step, seen, pointers) for step, seen, pointers in watch.at_generation if step > 0]
    assert later, "no generation after an optimizer step"
    for step, seen, pointers in later:
        assert pointers == trained
        for key, value in watch.after_step[step].items():
            assert torch.equal(seen[key], value), f"generation after step {step}: {key} is not step {step}'s"
        assert any(not torch.equal(seen[k], v) for k, v in watch.after_step.get(step - 1, {}).items()) or step == 1


# The policy's initial weights' std for the entropy-mask test: next-token entropies from about 1 to
# 4 nats (at the default 0.02 every one is within float noise of log 259).
SPREAD = 0.5


class EntropyMasks(TrainerCallback):
    """Records what TRL's ``get_high_entropy_mask`` (``top_entropy_quantile < 1``) returns, the
    completion tokens the loss keeps, with how many it could keep and their entropies' range."""

    def __init__(self):
        self.masks: list[torch.Tensor] = []
        self.valid: list[int] = []
        self.ranges: list[float] = []

    def attach(self, trainer) -> None:
        high_entropy_mask = trainer.get_high_entropy_mask

        def recording(entropies, mask, threshold):
            result = high_entropy_mask(entropies, mask, threshold)
            self.masks.append(result.clone())
            self.valid.append(int(mask.sum()))
            kept = entropies[mask.bool()]
            self.ranges.append(float(kept.max() - kept.min()))
            return result

        trainer.get_high_entropy_mask = recording


def test_grpo_top_entropy_quantile_through_ort_equals_grpo_trainer(tmp_path):
    """TRL's high-entropy token mask on a policy whose entropies spread: both engines keep the same
    tokens at every step, and the run is GRPOTrainer's. (On the default tiny model every entropy is
    within float noise of the quantile, and tokens fall on either side of it between engines; see
    docs/trl.md.) beta 0, TRL's default: with beta > 0 a step where the policy still equals its
    reference gives ORT float-noise gradients that Adam amplifies (docs/trl.md). The weights' absolute
    tolerance is the other tests' 1e-5 scaled as the weights are (std SPREAD against 0.02): 2.5e-4, a
    quarter of one Adam step at this learning rate, so one step taken the other way fails."""
    options = dict(num_generations=2, num_iterations=2, epsilon=0.02, top_entropy_quantile=0.2)
    runs, masks = [], []
    for engine, ort in (("pt", False), ("ort", True)):
        masks.append(EntropyMasks())
        runs.append(
            train(
                trl.GRPOTrainer,
                trl.GRPOConfig,
                ORTGRPOTrainer,
                ORTGRPOConfig,
                tmp_path / engine,
                ort,
                False,
                watch=masks[-1],
                initializer_range=SPREAD,
                **options,
            )
        )
    assert_same_online_run(*runs, [k for k in KEYS if k != "kl"], weights_atol=1e-5 * SPREAD / 0.02)
    theirs, ours = masks
    assert len(theirs.masks) == len(ours.masks) == 6  # one loss per step
    assert min(theirs.ranges) > 1.0, theirs.ranges  # the entropies spread (nats)
    for step, (a, b, valid) in enumerate(zip(theirs.masks, ours.masks, theirs.valid), 1):
        assert torch.equal(a, b), f"step {step}: other tokens kept by the entropy mask"
        assert 0 < int(a.sum()) < valid, f"step {step}: the mask kept {int(a.sum())} of {valid} tokens"
