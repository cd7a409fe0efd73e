"""ORTGRPOTrainer against GRPOTrainer from the same seed: the same completion tokens sampled at
every step, and per-step loss, reward, reward_std, kl (beta > 0), completion lengths, entropy and
clip ratios within 1e-4 over 6 steps, final weights alike; full fine-tune and LoRA, several
generations per prompt, loss types dapo (TRL's default) and grpo, num_iterations 2 (old-policy
log-probabilities), a reward function and a reward model. ORT proven to have trained, and
generation after optimizer step k proven to read the weights of step k."""

from __future__ import annotations

import pytest
import torch

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
