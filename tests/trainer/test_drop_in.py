"""ORTTrainer is a drop-in Trainer: the same recipe gives the same weights and buffers, the same
log_history (timings aside; ORT's own keys added) and the same files, with ORT proven to have run."""

from __future__ import annotations

import math
import os

import pytest
import torch
from drop_in_recipes import RECIPES
from tiny_models import tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

ADDED_KEY_PREFIXES = ("ort/", "density/", "memory/", "tokens/", "throughput/")
MEASURED_KEY_PREFIXES = (
    "memory/",
    "throughput/",
    "tokens/non_padding_per_s",
    "ort/export_s",
    "ort/first_step_s",
    "ort/export_peak_mb",
)


def _run(recipe: str, out, ort: bool, resume: str | None = None, **overrides):
    make_model, make_data, extra, trainer_kwargs = RECIPES[recipe]
    torch.manual_seed(0)
    model, data = make_model(), make_data()
    args = {
        "max_steps": 6,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-3,
        **extra,
        **overrides,
    }
    trainer = (ORTTrainer if ort else Trainer)(
        model=model,
        args=tiny_args(ORTTrainingArguments if ort else TrainingArguments, out, **args),
        train_dataset=data,
        eval_dataset=data if "eval_strategy" in args else None,
        **trainer_kwargs,
    )
    trainer.train(resume_from_checkpoint=resume)
    if ort:
        assert trainer.ort_engine_status().backend == "ort", trainer.ort_engine_status()
    return trainer, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _is_measured(key: str) -> bool:
    """Timings and memory: they differ between any two runs."""
    return key.endswith(("_runtime", "_per_second", "_time")) or key.startswith(MEASURED_KEY_PREFIXES)


def assert_same_logs(ref: list[dict], got: list[dict], added_prefixes=ADDED_KEY_PREFIXES, rtol: float = 1e-4) -> None:
    assert len(got) == len(ref), f"{len(got)} log entries, expected {len(ref)}"
    for step, (r, g) in enumerate(zip(ref, got)):
        # eval_model_preparation_time: the evaluation loop times accelerate's preparation of the
        # PyTorch model, which the training loop did not prepare (ORT ran it).
        added = [k for k in g if k not in r and k != "eval_model_preparation_time"]
        assert all(k.startswith(added_prefixes) for k in added), f"entry {step}: unexpected keys {added}"
        for key, value in r.items():
            assert key in g, f"entry {step}: {key} missing"
            if _is_measured(key):
                continue
            if isinstance(value, float):
                assert math.isclose(g[key], value, rel_tol=rtol, abs_tol=1e-6), (
                    f"entry {step} {key}: {g[key]} vs {value}"
                )
            else:
                assert g[key] == value, f"entry {step} {key}: {g[key]} vs {value}"


def assert_same_state(ref: dict, got: dict) -> None:
    # Adam turns float rounding in near-zero gradients into steps of up to lr (1e-3) on a few weights.
    assert ref.keys() == got.keys()
    for name, value in ref.items():
        if value.is_floating_point():
            torch.testing.assert_close(got[name], value, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")
        else:
            assert torch.equal(got[name], value), f"{name}: {got[name]} vs {value}"


def _files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_ort_trainer_trains_what_trainer_trains(recipe, tmp_path):
    ref, ref_state = _run(recipe, tmp_path / "pt", ort=False)
    got, got_state = _run(recipe, tmp_path / "ort", ort=True)
    assert_same_state(ref_state, got_state)
    assert_same_logs(ref.state.log_history, got.state.log_history)
    assert _files(tmp_path / "ort") == _files(tmp_path / "pt")
    changed = [k for k, v in got_state.items() if v.is_floating_point() and not torch.equal(v, _initial(recipe)[k])]
    assert changed, "training changed nothing: the comparison saw initial weights only"
    if "padding" in recipe:
        assert got.state.log_history[0]["ort/padding_eliminated"] == 1.0, "the graph ran with the padding"


def _initial(recipe: str) -> dict:
    torch.manual_seed(0)
    return RECIPES[recipe][0]().state_dict()


@pytest.mark.parametrize("recipe", ["classification-eval-accumulation", "batchnorm"])
def test_resumed_run_logs_and_trains_as_the_uninterrupted_one(recipe, tmp_path):
    save = dict(save_strategy="steps", save_steps=3)
    full, full_state = _run(recipe, tmp_path / "full", ort=True, **save)
    resumed, resumed_state = _run(
        recipe, tmp_path / "part", ort=True, resume=_copy_checkpoint(tmp_path, "full", "part"), **save
    )
    ref, ref_state = _run(recipe, tmp_path / "pt", ort=False, resume=_copy_checkpoint(tmp_path, "full", "pt"), **save)
    assert_same_state(full_state, resumed_state)
    assert_same_state(ref_state, resumed_state)
    # The last entry is the run summary: its train_loss averages this call's steps only, in Trainer too.
    assert_same_logs(full.state.log_history[:-1], resumed.state.log_history[:-1], added_prefixes=())
    assert_same_logs(ref.state.log_history, resumed.state.log_history)


def _copy_checkpoint(tmp_path, src: str, dst: str, step: int = 3) -> str:
    import shutil

    target = tmp_path / dst / f"checkpoint-{step}"
    shutil.copytree(tmp_path / src / f"checkpoint-{step}", target)
    return str(target)


def test_a_second_train_call_reuses_the_exported_graph(tmp_path):
    trainer, _ = _run("regression", tmp_path, ort=True)
    engine, exports = trainer.ort_engine, trainer.ort_engine_status().export_count
    trainer.train()
    assert trainer.ort_engine is engine and trainer.ort_engine_status().export_count == exports
    assert trainer.state.global_step == 6 and trainer.ort_engine_status().backend == "ort"
