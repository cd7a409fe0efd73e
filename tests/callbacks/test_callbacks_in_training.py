"""The callbacks' numbers land in trainer_state.json, under ORTTrainer and plain Trainer, and
never change training."""

import json

import torch
from datasets import Dataset
from tiny_models import FAMILIES, build
from transformers import Trainer, TrainingArguments

from ort_hf.callbacks import InputDensityCallback, MemoryObserverCallback
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

STEPS = 4


def _padded_dataset(n=32):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (n, 16), generator=gen)
    lengths = torch.randint(4, 17, (n,), generator=gen)
    mask = (torch.arange(16)[None, :] < lengths[:, None]).long()
    ids = ids * mask  # pad id 0
    return Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": (ids[:, 0] > 50).long().tolist()}
    ), float(mask.float().mean())


def _common(out):
    return dict(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=32,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )


def _history(trainer):
    trainer.save_state()
    with open(f"{trainer.args.output_dir}/trainer_state.json") as f:
        return [h for h in json.load(f)["log_history"] if "loss" in h]


def test_ort_trainer_logs_density_and_memory(tmp_path):
    data, density = _padded_dataset()
    trainer = ORTTrainer(
        model=build(FAMILIES["bert-cls"]),
        args=ORTTrainingArguments(**_common(tmp_path), ort_fallback="disable", ort_log_level="ERROR"),
        train_dataset=data,
    )
    trainer.train()
    assert trainer.ort_engine.engine_status().backend == "ort"
    history = _history(trainer)
    assert len(history) == STEPS
    first, later = history[0], history[1:]
    # the export step is reported on its own, never inside the per-step figures
    assert "ort/export_peak_mb" in first and "ort/first_step_s" in first and "memory/peak_mb" not in first
    assert "tokens/non_padding_per_s" not in first
    for entry in later:
        assert abs(entry["density/embed"] - density) < 1e-4  # one batch = the whole dataset
        assert entry["density/label"] == 1.0
        assert entry["tokens/non_padding_per_s"] > 0
        assert entry["memory/peak_mb"] > 0 and entry["memory/forward_peak_mb"] > 0
        assert entry["memory/backward_peak_mb"] > 0 and entry["memory/optimizer_peak_mb"] > 0
        assert entry["memory/run_peak_mb"] >= entry["memory/peak_mb"]


def test_same_callbacks_under_plain_trainer(tmp_path):
    data, density = _padded_dataset()
    trainer = Trainer(
        model=build(FAMILIES["bert-cls"]),
        args=TrainingArguments(**_common(tmp_path)),
        train_dataset=data,
        callbacks=[InputDensityCallback(), MemoryObserverCallback()],
    )
    trainer.train()
    history = _history(trainer)
    assert abs(history[-1]["density/embed"] - density) < 1e-4
    assert history[-1]["memory/peak_mb"] > 0 and history[-1]["tokens/non_padding_per_s"] > 0


def test_callbacks_observe_and_never_change_training(tmp_path):
    data, _ = _padded_dataset()
    losses = {}
    for on in (True, False):
        args = ORTTrainingArguments(
            **_common(tmp_path / str(on)),
            ort_fallback="disable",
            ort_log_level="ERROR",
            ort_density_callback=on,
            ort_memory_callback=on,
        )
        trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=data)
        trainer.train()
        losses[on] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert any("density/embed" in h for h in trainer.state.log_history) is on
    assert losses[True] == losses[False]
