"""One sweep case in its own process: ``python -m ort_hf.sweep.worker --task T --type M --modes a,b
--state DIR``. Trains the tiny model with ``Trainer`` (the reference), then once per mode with
``ORTTrainer`` from the same initial weights on the same batches, and tells the runner each stage's
start, each finished step and each stage's record as JSON lines in ``DIR/events-<n>.jsonl``.

The reference is also saved to ``DIR/reference.pt``: a worker the runner restarts after a mode
hung or died loads it instead of training the reference again."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from .cases import EVERY_MODE, MODES, SETTINGS, TASKS, Task, model_class_name

# A tiny config above this still carries a size attribute the rules missed: not trained, said so.
MAX_PARAMS = 20_000_000


class Events:
    """The JSON lines the runner reads while the worker runs (flushed at once)."""

    def __init__(self, path: Path):
        self.file = open(path, "a")

    def __call__(self, event: str, **fields) -> None:
        self.file.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
        self.file.flush()


@dataclass
class Case:
    task: Task
    model_type: str
    config: object
    specials: object
    tokenizer: object
    rows: list
    model_cls: type


def build_case(task: Task, model_type: str) -> Case:
    import transformers

    from .data import build_rows, build_tokenizer
    from .tiny_config import tiny_config

    config, specials = tiny_config(model_type, task.needs, task.num_labels)
    tokenizer = build_tokenizer(specials)
    model_cls = getattr(transformers, model_class_name(task, model_type))
    return Case(task, model_type, config, specials, tokenizer, build_rows(task, specials, SETTINGS), model_cls)


def build_model(case: Case, initial_state: dict | None = None):
    """The model from the tiny config with a fixed seed; ``initial_state`` (the reference's starting
    weights) makes a model built in another process start from the very same weights."""
    from transformers import set_seed

    set_seed(SETTINGS.seed)
    model = case.model_cls(case.config)
    if initial_state is not None:
        model.load_state_dict(initial_state)
    return model


def _one_line(exc: BaseException) -> str:
    text = " / ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}"[:300]


def run_reference(case: Case, emit) -> dict:
    """Trainer's run: ``{"record": ..., "initial_state": ..., "grads": ...}``."""
    from transformers import TrainingArguments

    from .data import build_collator
    from .recording import RecordingTrainer, StepRecorder

    started = time.perf_counter()
    try:
        model = build_model(case)
    except Exception as exc:
        traceback.print_exc()
        return {"record": {"status": "not-counted", "reason": f"model: {_one_line(exc)}"}}
    params = sum(p.numel() for p in model.parameters())
    facts = {
        "model_class": type(model).__name__,
        "params": params,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    if params > MAX_PARAMS:
        return {
            "record": {
                **facts,
                "status": "not-counted",
                "reason": f"tiny config still has {params / 1e6:.0f}M parameters (a size attribute the "
                "rules in sweep/tiny_config.py miss)",
            }
        }
    initial_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    recorder = StepRecorder(emit)
    with tempfile.TemporaryDirectory(prefix="ort-hf-sweep-") as out:
        try:
            trainer = RecordingTrainer(
                model=model,
                args=TrainingArguments(**SETTINGS.training_arguments(out)),
                train_dataset=case.rows,
                data_collator=build_collator(case.task, case.tokenizer, model, SETTINGS),
                callbacks=[recorder],
            )
            trainer.recorder = recorder
            trainer.train()
            reason = None
        except Exception as exc:
            traceback.print_exc()
            reason = f"Trainer failed at step {recorder.steps_done + 1}: {_one_line(exc)}"
    losses = recorder.losses
    if reason is None and not all(math.isfinite(x) for x in losses):
        reason = f"Trainer's loss is not finite: {losses}"
    record = {
        **facts,
        "status": "not-counted" if reason else "ok",
        "reason": reason,
        "losses": losses,
        "digests": recorder.digests,
        "fp32_grad_floor": None if reason else fp32_grad_floor(case, initial_state),
        "wall_s": time.perf_counter() - started,
    }
    return {"record": record, "initial_state": initial_state, "grads": recorder.grads}


def fp32_grad_floor(case: Case, initial_state: dict) -> float | None:
    """How far PyTorch's own float32 gradients are from float64's, relative, for this model on a batch
    of the case (one forward and backward of the model's loss in each): the accuracy float32 gives
    this model at all. Most models sit near 1e-6; one whose attention logits are unscaled (Gemma 4's
    scaling 1.0) near 2e-5, where PyTorch's two attention paths differ from each other by 1e-5.
    None when the model does not run in float64, or its float64 gradients are not finite."""
    import torch

    from .data import build_collator
    from .recording import gradient_errors

    grads = {}
    try:
        for dtype in (torch.float64, torch.float32):
            model = build_model(case, initial_state).to(dtype).train()
            batch = build_collator(case.task, case.tokenizer, model, SETTINGS)(case.rows[: SETTINGS.batch_size])
            batch = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}
            model(**batch).loss.backward()
            grads[dtype] = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    except Exception:
        traceback.print_exc()
        return None
    floor = gradient_errors(grads[torch.float64], grads[torch.float32])["grad_rel_error"]
    return floor if math.isfinite(floor) else None  # e.g. ProphetNet's float64 loss is NaN


def run_mode(case: Case, mode: str, reference: dict, emit) -> dict:
    """ORTTrainer's run in ``mode``, from the reference's initial weights: the raw facts the runner
    classifies (cells.classify)."""
    from ..trainer import ORTTrainingArguments
    from .data import build_collator
    from .recording import StepRecorder, describe_exception, gradient_errors, recording_ort_trainer_class

    started = time.perf_counter()
    model = build_model(case, reference["initial_state"])
    recorder = StepRecorder(emit)
    error, trainer = None, None
    with tempfile.TemporaryDirectory(prefix="ort-hf-sweep-") as out:
        try:
            args = ORTTrainingArguments(
                **SETTINGS.training_arguments(out), **EVERY_MODE, **MODES[mode], ort_intra_op_threads=1
            )  # two workers share two cores
            trainer = recording_ort_trainer_class()(
                model=model,
                args=args,
                train_dataset=case.rows,
                data_collator=build_collator(case.task, case.tokenizer, model, SETTINGS),
                callbacks=[recorder],
            )
            trainer.recorder = recorder
            trainer.train()
        except Exception as exc:
            traceback.print_exc()
            error = describe_exception(exc, recorder.steps_done)
    status = trainer.ort_engine_status() if trainer is not None else None
    engine = getattr(trainer, "ort_engine", None) if status is not None else None
    ref_digests = reference["record"]["digests"]
    mismatch = next((i + 1 for i, (a, b) in enumerate(zip(recorder.digests, ref_digests)) if a != b), None)
    return {
        "losses": recorder.losses,
        "steps_done": recorder.steps_done,
        "error": error,
        "backend": status.backend if status is not None else None,
        "fallback_reason": status.fallback_reason if status is not None else None,
        "export_s": status.export_seconds if status is not None else None,
        "swapped": status.swapped if status is not None else None,
        "padding": _padding_facts(engine),
        # The fused LM-head loss ran as a PythonOp of ORT's graph (first_step checks the graph).
        "chunked_lm_loss": bool(recorder.facts.get("ort/chunked_lm_loss")),
        "batches_differ_at_step": mismatch,
        **gradient_errors(reference["grads"] or {}, recorder.grads),
        "wall_s": time.perf_counter() - started,
    }


def _padding_facts(engine) -> dict | None:
    """What the padding rewrites did in a run: token positions kept by the trim, of all the batches',
    and the nodes that padding elimination runs unpadded in the last graph built (0: it did not act)."""
    if engine is None:
        return None
    rewrite = engine.padding_rewrite
    return {**engine.padding_stats, "unpadded_nodes": rewrite.unpadded_nodes if rewrite is not None else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ort_hf.sweep.worker", description=__doc__)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--type", required=True, dest="model_type")
    parser.add_argument("--modes", required=True, help="comma-separated, from " + ", ".join(MODES))
    parser.add_argument("--state", required=True, help="folder shared with the runner (events, reference.pt)")
    parser.add_argument("--attempt", type=int, default=0)
    ns = parser.parse_args(argv)
    state = Path(ns.state)
    emit = Events(state / f"events-{ns.attempt}.jsonl")
    emit("start", stage="reference")

    import torch

    torch.set_num_threads(1)  # two workers share two cores (ORT's pool: ort_intra_op_threads=1)
    task = TASKS[ns.task]
    try:
        case = build_case(task, ns.model_type)
    except Exception as exc:
        traceback.print_exc()
        emit("done", stage="reference", record={"status": "not-counted", "reason": f"tiny config: {_one_line(exc)}"})
        return 0
    saved = state / "reference.pt"
    if saved.is_file():
        reference = torch.load(saved, weights_only=True)  # tensors, dicts, lists and plain values only
    else:
        reference = run_reference(case, emit)
        if reference["record"]["status"] == "ok":
            torch.save(reference, saved)
        emit("done", stage="reference", record=reference["record"])
    if reference["record"]["status"] != "ok":
        return 0
    for mode in [m for m in ns.modes.split(",") if m]:
        emit("start", stage=mode)
        emit("done", stage=mode, record=run_mode(case, mode, reference, emit))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
