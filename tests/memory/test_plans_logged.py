"""ORTTrainer logs and saves ORT's recompute plans when recompute is on, and reads none otherwise."""

import json

import pytest
from tiny_models import FAMILIES, build, rule_dataset, tiny_args

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.first_step import MEMORY_PLANS_FILE


@pytest.mark.parametrize("level", [0, 1])
def test_plans_logged_and_saved_only_with_recompute(level, tmp_path):
    args = tiny_args(
        ORTTrainingArguments, tmp_path, max_steps=2, per_device_train_batch_size=4, ort_memory_opt_level=level
    )
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=rule_dataset(16))
    trainer.train()
    assert trainer.ort_engine_status().backend == "ort"
    first = next(h for h in trainer.state.log_history if "loss" in h)
    saved = tmp_path / MEMORY_PLANS_FILE
    if level == 0:
        assert "memory/plans_on" not in first and not saved.exists()
        manager = trainer._ort_run.engine._training_manager()
        assert manager._ort_hf_plans_pending, "the plans were read with nothing asking for them"
    else:
        plans = json.loads(saved.read_text())
        assert plans and first["memory/plans_on"] == sum(p["enabled"] for p in plans) > 0
