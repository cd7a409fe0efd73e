"""The Trainer features a user expects keep working under ORTTrainer."""

import numpy as np
import pytest
import torch
from tiny_models import FAMILIES, build, rule_dataset
from transformers import TrainerCallback

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

_dataset = rule_dataset


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=1e-3,
        logging_steps=2,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    base.update(kw)
    return ORTTrainingArguments(**base)


class Recorder(TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, **kw):
        self.events.append("train_begin")

    def on_step_end(self, args, state, control, **kw):
        self.events.append("step_end")

    def on_log(self, args, state, control, logs=None, **kw):
        self.events.append("log")


def test_model_init_metrics_preprocess_and_callbacks(tmp_path):
    seen_shapes = []

    def preprocess(logits, labels):
        seen_shapes.append(tuple(logits.shape))
        return logits.argmax(-1)

    def metrics(pred):
        return {"accuracy": float(np.mean(pred.predictions == pred.label_ids))}

    recorder = Recorder()
    trainer = ORTTrainer(
        model_init=lambda: build(FAMILIES["bert-cls"]),
        args=_args(tmp_path, eval_strategy="steps", eval_steps=3),
        train_dataset=_dataset(),
        eval_dataset=_dataset(16, seed=1),
        compute_metrics=metrics,
        preprocess_logits_for_metrics=preprocess,
        callbacks=[recorder],
    )
    trainer.train()
    assert trainer.ort_engine.engine_status().backend == "ort"
    assert trainer.ort_engine.module.model is trainer.model  # model_init's model is what ORT trained
    evals = [h for h in trainer.state.log_history if "eval_accuracy" in h]
    assert len(evals) == 2 and all(0.0 <= h["eval_accuracy"] <= 1.0 for h in evals)
    assert seen_shapes and all(s[-1] == 2 for s in seen_shapes)
    assert recorder.events.count("step_end") == 6 and "train_begin" in recorder.events
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged[0]["ort/fallback"] == 0.0 and "ort/export_s" in logged[0]


def test_eval_in_ort_matches_pytorch_eval(tmp_path):
    metrics = {}
    for in_ort in (False, True):
        trainer = ORTTrainer(
            model=build(FAMILIES["bert-cls"]),
            args=_args(tmp_path / str(in_ort), ort_eval_in_ort=in_ort),
            train_dataset=_dataset(),
            eval_dataset=_dataset(16, seed=1),
        )
        trainer.train()
        metrics[in_ort] = trainer.evaluate()["eval_loss"]
        if in_ort:
            assert (
                trainer._ort_run.eval_engine is not None
                and trainer._ort_run.eval_engine.engine_status().backend == "ort"
            )
    assert abs(metrics[True] - metrics[False]) <= 1e-5


def test_use_ort_false_is_plain_pytorch(tmp_path):
    trainer = ORTTrainer(
        model=build(FAMILIES["bert-cls"]), args=_args(tmp_path, use_ort=False), train_dataset=_dataset()
    )
    trainer.train()
    assert trainer.ort_engine is None
    assert trainer.state.global_step == 6


def test_plain_training_arguments_are_accepted(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        learning_rate=3e-4,
        disable_tqdm=True,
    )
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=_dataset())
    assert isinstance(trainer.args, ORTTrainingArguments) and trainer.args.learning_rate == 3e-4
    trainer.train()
    assert trainer.ort_engine.engine_status().backend == "ort"


def test_auto_find_batch_size_trains(tmp_path):
    trainer = ORTTrainer(
        model=build(FAMILIES["bert-cls"]), args=_args(tmp_path, auto_find_batch_size=True), train_dataset=_dataset()
    )
    trainer.train()
    assert trainer.state.global_step == 6 and trainer.ort_engine.engine_status().backend == "ort"


def test_dataset_without_labels_gets_a_clear_error(tmp_path):
    data = _dataset().remove_columns("labels")
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=_args(tmp_path), train_dataset=data)
    with pytest.raises(ValueError, match="did not return a loss.*inputs it received are input_ids"):
        trainer.train()


def test_compare_steps_logs_break_even_and_stays_one_run(tmp_path):
    """--ort_compare_steps: steps 2-3 through ORT, 4-5 in PyTorch, then ORT again: the losses and
    weights are those of an uninterrupted ORT run (no dropout), and the measurement is logged once."""
    runs = {}
    for compare in (0, 2):
        model = build(FAMILIES["bert-cls"])
        trainer = ORTTrainer(
            model=model,
            args=_args(tmp_path / str(compare), max_steps=7, logging_steps=1, ort_compare_steps=compare),
            train_dataset=_dataset(),
        )
        trainer.train()
        assert trainer.ort_engine_status().backend == "ort"
        runs[compare] = (
            trainer,
            [h["loss"] for h in trainer.state.log_history if "loss" in h],
            {n: p.detach().clone() for n, p in model.named_parameters()},
        )
    (_, plain, plain_w), (trainer, compared, compared_w) = runs[0], runs[2]
    assert max(abs(a - b) for a, b in zip(plain, compared)) <= 1e-4
    for name, value in plain_w.items():
        torch.testing.assert_close(compared_w[name], value, rtol=1e-4, atol=1e-5)
    logged = [h for h in trainer.state.log_history if "ort/break_even_steps" in h]
    assert len(logged) == 1 and logged[0]["step"] == 6  # reported once, when ORT resumes
    assert logged[0]["ort/step_ms"] > 0 and logged[0]["ort/pytorch_step_ms"] > 0
    assert trainer.ort_engine._run.use_pytorch is False  # back on ORT for the rest of the run
