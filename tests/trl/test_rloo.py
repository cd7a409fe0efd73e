"""ORTRLOOTrainer against RLOOTrainer from the same seed: the same completion tokens sampled at
every step, and per-step loss, reward, reward_std, kl (beta > 0), completion lengths, entropy and
clip ratio within 1e-4 over 6 steps, final weights alike; full fine-tune (num_iterations 2) and
LoRA, several generations per prompt; ORT proven to have trained."""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")

from online_runs import assert_same_online_run, train  # noqa: E402

from ort_hf.trl import ORTRLOOConfig, ORTRLOOTrainer  # noqa: E402

KEYS = (
    "loss",
    "reward",
    "reward_std",
    "kl",
    "completions/mean_length",
    "entropy",
    "clip_ratio/region_mean",
    "rewards/letters/mean",
    "num_tokens",
)

# name -> (LoRA, RLOOConfig options); epsilon small with num_iterations 2: clip_ratio compares non-zero values
CONFIGS = {
    "full-2-iterations": (False, dict(num_generations=2, beta=0.05, num_iterations=2, epsilon=0.02)),
    "lora": (True, dict(num_generations=4, beta=0.05)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rloo_through_ort_equals_rloo_trainer(name, tmp_path):
    lora, options = CONFIGS[name]
    runs = [
        train(trl.RLOOTrainer, trl.RLOOConfig, ORTRLOOTrainer, ORTRLOOConfig, tmp_path / engine, ort, lora, **options)
        for engine, ort in (("pt", False), ("ort", True))
    ]
    assert_same_online_run(*runs, KEYS)
