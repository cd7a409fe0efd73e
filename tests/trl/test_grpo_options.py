"""GRPO options beyond the parity matrix of test_grpo.py, each against GRPOTrainer from the same seed
(full fine-tune, beta 0.1, 3 steps): the same tokens sampled, the logs within 1e-4. Slow
(`make test-all`): a pair of runs per option."""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")

import online_runs  # noqa: E402
from online_runs import train  # noqa: E402

from ort_hf.trl import ORTGRPOConfig, ORTGRPOTrainer  # noqa: E402

KEYS = ("loss", "reward", "kl", "entropy", "clip_ratio/region_mean", "completions/mean_length")
OPTIONS = {
    **{loss: {"loss_type": loss} for loss in ("dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")},
    "entropy_coef": {"entropy_coef": 0.01},
    "cast_lm_head_to_fp32": {"cast_lm_head_to_fp32": True},
    "continuous_batching": {"use_transformers_continuous_batching": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTIONS))
def test_grpo_option_through_ort_equals_grpo_trainer(name, tmp_path, monkeypatch):
    monkeypatch.setattr(online_runs, "STEPS", 3)
    runs = [
        train(
            trl.GRPOTrainer,
            trl.GRPOConfig,
            ORTGRPOTrainer,
            ORTGRPOConfig,
            tmp_path / engine,
            ort,
            False,
            num_generations=2,
            beta=0.1,
            **OPTIONS[name],
        )
        for engine, ort in (("pt", False), ("ort", True))
    ]
    online_runs.assert_ort_trained_on_used_rows(runs[1][0])
    assert runs[0][1].sampled == runs[1][1].sampled, "different tokens sampled"
    rows = [[{k: h[k] for k in KEYS if k in h} for h in t.state.log_history if "loss" in h] for t, _ in runs]
    assert len(rows[0]) == len(rows[1]) == 3
    online_runs.assert_same_logs(*rows)
