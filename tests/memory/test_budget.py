"""Budget mode walks the recompute ladder on measured peaks, re-exporting at most twice."""

import logging

import torch
from datasets import Dataset
from tiny_models import FAMILIES, build

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.budget import MemoryBudgetController


def _trainer(tmp_path, budget):
    ids = torch.randint(3, 100, (64, 16), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 16] * 64,
                              "labels": (ids[:, 0] % 2).tolist()})
    args = ORTTrainingArguments(output_dir=str(tmp_path), max_steps=12, per_device_train_batch_size=8, logging_steps=4,
                                report_to=[], save_strategy="no", disable_tqdm=True, ort_fallback="disable",
                                ort_log_level="ERROR", ort_memory_budget_mb=budget)
    return ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=data)


def _controller(trainer):
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MemoryBudgetController))


def test_a_roomy_budget_keeps_recompute_off(tmp_path):
    trainer = _trainer(tmp_path, budget=1e6)
    trainer.train()
    ctl = _controller(trainer)
    assert ctl.done and [t["memory_opt_level"] for t in ctl.tried] == [0]
    assert trainer.ort_engine_status().export_count == 1


def test_an_impossible_budget_tries_each_level_once_and_says_so(tmp_path, caplog):
    trainer = _trainer(tmp_path, budget=1.0)
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        trainer.train()
    ctl = _controller(trainer)
    assert [t["memory_opt_level"] for t in ctl.tried] == [0, 1, 2]
    assert trainer._ort_engine_module.options.memory_opt_level == 2
    status = trainer.ort_engine_status()
    assert status.backend == "ort" and status.export_count == 3  # the first export and two re-exports
    said = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert len(said) == 1 and "no recompute level fits" in said[0]
    logged = next(h for h in trainer.state.log_history if "memory/budget_level" in h)
    assert logged["memory/budget_level"] == 2.0 and logged["memory/budget_fits"] == 0.0
