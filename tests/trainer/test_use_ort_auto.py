"""--use_ort auto: ORT and PyTorch are timed inside the run, and the rest of the run trains on the
faster one. Which one is faster depends on the machine, so each outcome is forced by the measured
medians; the run must stay one run either way (losses, weights and optimizer state of an
uninterrupted Trainer run from the same seed)."""

import logging

import pytest
import torch
from tiny_models import FAMILIES, build, rule_dataset, tiny_args
from transformers import HfArgumentParser, Trainer, TrainingArguments

from ort_hf.engine import ORTTrainingModule
from ort_hf.report.summary import run_summary
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.break_even import BreakEvenCallback
from ort_hf.trainer.training_args import AUTO_COMPARE_STEPS

COMMON = dict(max_steps=8, per_device_train_batch_size=8, learning_rate=1e-3)


def _parse(*argv):
    return HfArgumentParser(ORTTrainingArguments).parse_args_into_dataclasses(["--output_dir", "out", *argv])[0]


def test_use_ort_parses_true_false_and_auto():
    assert _parse().use_ort is True and _parse().ort_compare_steps == 0
    assert _parse("--use_ort").use_ort is True
    assert _parse("--use_ort", "False").use_ort is False and _parse("--use_ort", "false").use_ort is False
    assert _parse("--use_ort", "true").use_ort is True
    auto = _parse("--use_ort", "auto")
    assert auto.use_ort == "auto" and auto.ort_compare_steps == AUTO_COMPARE_STEPS
    assert _parse("--use_ort", "auto", "--ort_compare_steps", "3").ort_compare_steps == 3
    for value in (True, False, "auto"):
        assert ORTTrainingArguments(output_dir="out", report_to=[], use_ort=value).use_ort == value
    with pytest.raises(ValueError, match="needs --use_ort true or auto"):
        _parse("--use_ort", "false", "--ort_compare_steps", "3")


def _trainer_run(output_dir):
    model = build(FAMILIES["bert-cls"])
    trainer = Trainer(
        model=model, args=tiny_args(TrainingArguments, output_dir, **COMMON), train_dataset=rule_dataset(64)
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("faster", ["ort", "pytorch"])
def test_auto_continues_on_the_faster_engine_as_one_run(tmp_path, monkeypatch, caplog, faster):
    medians = (0.01, 0.02) if faster == "ort" else (0.02, 0.01)  # (ORT, PyTorch) seconds per step
    monkeypatch.setattr(BreakEvenCallback, "medians", lambda self: medians)
    ort_runs = []
    real_run_ort = ORTTrainingModule._run_ort
    monkeypatch.setattr(ORTTrainingModule, "_run_ort", lambda self, *a: ort_runs.append(1) or real_run_ort(self, *a))

    model = build(FAMILIES["bert-cls"])
    args = tiny_args(ORTTrainingArguments, tmp_path / "ort", use_ort="auto", ort_compare_steps=2, **COMMON)
    trainer = ORTTrainer(model=model, args=args, train_dataset=rule_dataset(64))
    with caplog.at_level(logging.WARNING):
        trainer.train()

    # Step 1 exports, 2-3 through ORT, 4-5 in PyTorch, 6-8 on the faster engine.
    assert len(ort_runs) == (6 if faster == "ort" else 3)
    engine = trainer.ort_engine
    assert engine.engine_status().backend == faster and engine.engine_status().fallback_reason is None
    assert (
        run_summary(trainer, {})["engine"]
        == {"ort": "ort", "pytorch": "pytorch (--use_ort auto measured it faster)"}[faster]
    )
    logged = [h for h in trainer.state.log_history if "ort/auto_chose_pytorch" in h]
    assert len(logged) == 1 and logged[0]["ort/auto_chose_pytorch"] == float(faster == "pytorch")
    # The log line states the break-even point and what it means for this run's 8 steps.
    (said,) = [r.getMessage() for r in caplog.records if "measured in this run" in r.getMessage()]
    if faster == "ort":
        assert f"whole run is the faster from {logged[0]['ort/break_even_steps']:.0f} steps on" in said
        # A run shorter than its break-even point is told how the next one can skip the export.
        assert logged[0]["ort/break_even_steps"] > 8 and "--ort_export_cache_dir DIR lets the next run" in said
    else:
        assert logged[0]["ort/break_even_steps"] == float("inf") and "never the faster" in said
    assert "this run's 8 steps at these rates" in said

    reference = _trainer_run(tmp_path / "trainer")
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    expected = [h["loss"] for h in reference.state.log_history if "loss" in h]
    assert len(losses) == 8 and max(abs(a - b) for a, b in zip(losses, expected)) <= 1e-4
    for (name, value), ref in zip(model.named_parameters(), reference.model.parameters()):
        torch.testing.assert_close(value, ref, rtol=1e-4, atol=1e-5, msg=name)
    state, ref_state = trainer.optimizer.state_dict()["state"], reference.optimizer.state_dict()["state"]
    assert state.keys() == ref_state.keys()
    for key in state:
        assert state[key]["step"] == ref_state[key]["step"] == 8
        torch.testing.assert_close(state[key]["exp_avg_sq"], ref_state[key]["exp_avg_sq"], rtol=1e-3, atol=1e-9)


def test_auto_is_refused_in_distributed_training(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it for each rank
    with pytest.raises(ValueError, match="in distributed training, pass --use_ort true or false"):
        _parse("--use_ort", "auto")
    assert _parse("--ort_compare_steps", "5").ort_compare_steps == 5  # measuring only: every rank keeps ORT
