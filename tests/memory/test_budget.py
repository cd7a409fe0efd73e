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
    assert len(said) == 1 and "no recompute configuration fits" in said[0]
    logged = next(h for h in trainer.state.log_history if "memory/budget_level" in h)
    assert logged["memory/budget_level"] == 2.0 and logged["memory/budget_fits"] == 0.0


def _plan(plan, frequency, mb):
    from ort_hf.engine.wrap import MemoryPlan

    return MemoryPlan(plan=plan, frequency=frequency, bytes_saved=mb * 2**20, symbolic_saving="", enabled=False)


def test_cheap_plans_go_by_saving_per_cost_and_never_recompute_a_matmul():
    from ort_hf.trainer.budget import cheap_plans, plan_cost

    plans = [_plan("FusedMatMul+Add+:1:-1", 7, 300), _plan("Gelu+:1:-1", 7, 40),
             _plan("Add+:1:-1", 12, 20), _plan("Mul+Dropout+:1:-1", 6, 36), _plan("Cast+:2:-1", 4, 90)]
    assert plan_cost("FusedMatMul+Add+:1:-1", 7) is None and plan_cost("Cast+:2:-1", 4) is None
    # per cost: Gelu 40/21 = 1.9, Add 20/12 = 1.7, Mul+Dropout 36/24 = 1.5
    assert cheap_plans(plans, excess_bytes=10 * 2**20) == ("Gelu+:1:-1",)
    assert cheap_plans(plans, excess_bytes=40 * 2**20) == ("Gelu+:1:-1", "Add+:1:-1")
    assert cheap_plans(plans, excess_bytes=90 * 2**20) is None  # cheap plans cannot cover it: level 1 next


def test_with_auto_find_batch_size_a_batch_that_fits_nowhere_is_made_smaller(tmp_path, caplog):
    trainer = _trainer(tmp_path, budget=1.0)
    trainer.args.auto_find_batch_size = True
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        trainer.train()
    ctl = _controller(trainer)
    # every batch size walks the ladder (two re-exports at most), then accelerate's search shrinks it
    batches = list(dict.fromkeys(t["batch_size"] for t in ctl.history))
    assert batches[0] == 8 and batches[-1] == 1 and batches == sorted(batches, reverse=True)
    assert [(t["batch_size"], t["memory_opt_level"]) for t in ctl.history] == [
        (b, level) for b in batches for level in (0, 1, 2)]
    assert all(t["samples_per_s"] > 0 for t in ctl.history)
    assert trainer.state.global_step == 12  # the last attempt trained every step
    said = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert sum("retrying with a smaller batch" in m for m in said) == len(batches) - 1 and "no recompute configuration fits" in said[-1]
    logged = next(h for h in trainer.state.log_history if "memory/budget_batch_size" in h)
    assert logged["memory/budget_batch_size"] == 1.0 and logged["memory/budget_fits"] == 0.0
    # steps taken at the batches that did not fit were rolled back before each retry
    assert ctl._snapshot is not None and all(torch.equal(before[k], ctl._snapshot[k]) for k in before)
