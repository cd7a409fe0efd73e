"""Budget mode walks the recompute ladder on measured peaks, re-exporting at most twice."""

import dataclasses
import logging
import types

import torch
from datasets import Dataset
from tiny_models import FAMILIES, build

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.budget import MemoryBudgetController


def _trainer(tmp_path, budget):
    ids = torch.randint(3, 100, (64, 16), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": [[1] * 16] * 64, "labels": (ids[:, 0] % 2).tolist()}
    )
    args = ORTTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=12,
        per_device_train_batch_size=8,
        logging_steps=4,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
        ort_memory_budget_mb=budget,
    )
    return ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=data)


def _controller(trainer):
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MemoryBudgetController))


def test_a_roomy_budget_starts_heavy_then_drops_recompute(tmp_path):
    trainer = _trainer(tmp_path, budget=1e6)
    trainer.train()
    ctl = _controller(trainer)
    # level 2 measured, ORT's plan table says no recompute fits too: one re-export, measured again
    assert ctl.done and [t["memory_opt_level"] for t in ctl.tried] == [2, 0]
    assert trainer.ort_engine.options.memory_opt_level == 0
    assert trainer.ort_engine_status().export_count == 2


def test_an_impossible_budget_stops_at_the_heaviest_rung_and_says_so(tmp_path, caplog):
    trainer = _trainer(tmp_path, budget=1.0)
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        trainer.train()
    ctl = _controller(trainer)
    assert [t["memory_opt_level"] for t in ctl.tried] == [2]  # nothing lighter can fit if level 2 does not
    assert trainer.ort_engine.options.memory_opt_level == 2
    status = trainer.ort_engine_status()
    assert status.backend == "ort" and status.export_count == 1
    said = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert len(said) == 1 and "no recompute configuration fits" in said[0]
    logged = next(h for h in trainer.state.log_history if "memory/budget_level" in h)
    assert logged["memory/budget_level"] == 2.0 and logged["memory/budget_fits"] == 0.0


def _plan(plan, frequency, mb):
    from ort_hf.engine.memory_plans import MemoryPlan

    return MemoryPlan(plan=plan, frequency=frequency, bytes_saved=mb * 2**20, symbolic_saving="", enabled=False)


def test_cheap_plans_go_by_saving_per_cost_and_never_recompute_a_matmul():
    from ort_hf.trainer.budget import cheap_plans, plan_cost

    plans = [
        _plan("FusedMatMul+Add+:1:-1", 7, 300),
        _plan("Gelu+:1:-1", 7, 40),
        _plan("Add+:1:-1", 12, 20),
        _plan("Mul+Dropout+:1:-1", 6, 36),
        _plan("Cast+:2:-1", 4, 90),
    ]
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
    # every batch size is measured on the heaviest rung, then accelerate's search shrinks it
    batches = list(dict.fromkeys(t["batch_size"] for t in ctl.history))
    assert batches[0] == 8 and batches[-1] == 1 and batches == sorted(batches, reverse=True)
    assert [(t["batch_size"], t["memory_opt_level"]) for t in ctl.history] == [(b, 2) for b in batches]
    assert all(t["samples_per_s"] > 0 for t in ctl.history)
    assert trainer.state.global_step == 12  # the last attempt trained every step
    said = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert (
        sum("retrying with a smaller batch" in m for m in said) == len(batches) - 1
        and "no recompute configuration fits" in said[-1]
    )
    logged = next(h for h in trainer.state.log_history if "memory/budget_batch_size" in h)
    assert logged["memory/budget_batch_size"] == 1.0 and logged["memory/budget_fits"] == 0.0
    # steps taken at the batches that did not fit were rolled back before each retry
    assert ctl._snapshot is not None and all(torch.equal(before[k], ctl._snapshot[k]) for k in before)


class _FakeEngine:
    """Stands in for the ORT module: options, a plan table, and the re-exports asked for."""

    def __init__(self, plans):
        from ort_hf.engine import ORTOptions

        self.options = ORTOptions(memory_opt_level=2)
        self.plans = plans
        self.reconfigured = []

    def memory_plans(self):
        return [dataclasses.replace(p, enabled=self.options.memory_opt_level > 0) for p in self.plans]

    def reconfigure(self, options):
        self.options = options
        self.reconfigured.append(options)


def _decide(budget, engine, peaks):
    """Feed measured peaks (one per rung tried) to a controller; return it."""
    logged = {}
    trainer = types.SimpleNamespace(
        state=types.SimpleNamespace(train_batch_size=8),
        add_ort_logs=logged.update,
        args=types.SimpleNamespace(auto_find_batch_size=False),
        logged=logged,
    )
    ctl = MemoryBudgetController(trainer, budget, observer=None)
    args = types.SimpleNamespace(gradient_accumulation_steps=1, world_size=1)
    for peak in peaks:
        ctl.peaks = [peak]
        ctl._decide(args, engine)
        if ctl.done:
            break
    return ctl


PLANS = [_plan("FusedMatMul+Add+:1:-1", 7, 300), _plan("Gelu+:1:-1", 7, 40), _plan("Add+:1:-1", 12, 20)]


def test_the_lightest_rung_estimated_to_fit_is_tried_after_the_heaviest():
    # level 2 peaks at 1,000 MB and its plans save 360 MB: no recompute ~1,360 MB
    engine = _FakeEngine(PLANS)
    ctl = _decide(2000, engine, [1000, 1300])
    assert [_rung_of(o) for o in engine.reconfigured] == ["level 0"] and ctl.done
    engine = _FakeEngine(PLANS)  # 1,360 MB is over 1,400 less 5%; Gelu's plan saves 40 MB, covering 30 MB x 1.25
    ctl = _decide(1400, engine, [1000, 1300])
    assert [_rung_of(o) for o in engine.reconfigured] == ["plans Gelu+:1:-1"]
    engine = _FakeEngine(PLANS)  # cheap plans cannot cover 1,360 - 1,311 MB: layer-wise recompute (level 1)
    ctl = _decide(1380, engine, [1000, 1300])
    assert [_rung_of(o) for o in engine.reconfigured] == ["level 1"]
    # level 1 would lose the compromised plan's 90 MB: nothing lighter fits, level 2 kept, no re-export
    engine = _FakeEngine(PLANS + [_plan("Cast+:2:-1", 4, 90)])
    ctl = _decide(1100, engine, [1000])
    assert engine.reconfigured == [] and ctl.done and ctl.reexports == 0


def test_a_lighter_rung_that_does_not_fit_after_all_goes_back_to_the_one_that_did():
    engine = _FakeEngine(PLANS)
    ctl = _decide(2000, engine, [1000, 2500])  # estimated 1,360 MB, measured 2,500 MB
    assert [_rung_of(o) for o in engine.reconfigured] == ["level 0", "level 2"]
    assert ctl.done and ctl.reexports == 2 and engine.options.memory_opt_level == 2
    assert ctl.trainer.logged["memory/budget_fits"] == 1.0


def _rung_of(options):
    from ort_hf.trainer.budget import describe

    return describe(options.memory_opt_level, options.memory_opt_plans)
