"""What a sweep run keeps of its training: each step's exact loss, the batches' hashes, the step-1
gradients, and (for an exception) what the user would read. Shared by the Trainer and ORTTrainer runs."""

from __future__ import annotations

import math

import torch
from transformers import Trainer, TrainerCallback

from .data import batch_digest
from .messages import condense


class StepRecorder(TrainerCallback):
    """Step-1 gradients (before the optimizer uses them) and each finished step, told to ``emit``."""

    def __init__(self, emit=None):
        self.emit = emit or (lambda *args, **kwargs: None)
        self.losses: list[float] = []
        self.digests: list[str] = []
        self.grads: dict[str, torch.Tensor] | None = None
        self.steps_done = 0
        self.facts: dict[str, float] = {}  # ORTTrainer's logged facts about its graph (ort/...)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0 and self.grads is None:
            # model is the plain HF model for both trainers: ORT writes its gradients into its parameters.
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.facts.update({k: v for k, v in (logs or {}).items() if k.startswith("ort/")})

    def on_step_end(self, args, state, control, **kwargs):
        self.steps_done = state.global_step
        self.emit("step", step=state.global_step, loss=self.losses[-1] if self.losses else None)


class LossRecording:
    """Mixin for a Trainer class: ``training_step``'s returned loss, unrounded (logged losses are
    rounded to 4 digits), and the hash of the batch it trained on, into ``self.recorder``."""

    recorder: StepRecorder

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.recorder.digests.append(batch_digest(inputs))
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.recorder.losses.append(loss.item())
        return loss


class RecordingTrainer(LossRecording, Trainer):
    pass


def recording_ort_trainer_class():
    from ..trainer import ORTTrainer

    return type("RecordingORTTrainer", (LossRecording, ORTTrainer), {})


# A parameter's relative error is measured against at least this share of the whole gradient's norm:
# a gradient that is zero up to rounding (an attention key's bias, which softmax ignores) would
# otherwise show the ratio of two rounding noises.
NEGLIGIBLE_GRAD_SHARE = 1e-3


def _ratio(diff: float, ref: float) -> float:
    return diff / ref if ref > 0 else (0.0 if diff == 0 else math.inf)


def gradient_errors(reference: dict[str, torch.Tensor], got: dict[str, torch.Tensor] | None) -> dict:
    """``||g - g_ref|| / ||g_ref||`` over all parameters together, and the parameter whose own
    relative error is worst. A gradient one side lacks counts as zeros (PyTorch's None)."""
    if got is None:
        return {"grad_rel_error": None, "worst_param": None, "worst_param_rel_error": None}
    norms = {}
    for name in sorted(set(reference) | set(got)):
        ref, mine = reference.get(name), got.get(name)
        ref = torch.zeros_like(mine) if ref is None else ref.double()
        mine = torch.zeros_like(ref) if mine is None else mine.double()
        norms[name] = ((mine - ref).norm().item(), ref.norm().item())
    total_diff = math.sqrt(sum(d * d for d, _ in norms.values()))
    total_ref = math.sqrt(sum(r * r for _, r in norms.values()))
    floor = NEGLIGIBLE_GRAD_SHARE * total_ref
    own = {name: _ratio(d, max(r, floor)) for name, (d, r) in norms.items()}
    worst = max(own, key=lambda n: (math.isnan(own[n]), own[n]), default=None)
    return {
        "grad_rel_error": _ratio(total_diff, total_ref),
        "worst_param": worst,
        "worst_param_rel_error": own[worst] if worst is not None else None,
    }


def describe_exception(exc: BaseException, steps_done: int) -> dict:
    """What the user reads (the outermost message, one line, ~300 chars) and whether ort_hf raised it
    on purpose: one of its own error classes, or a ValueError / RuntimeError whose message starts
    with "ort_hf", anywhere in the chain (ORTTrainer re-raises engine errors as "ORT failed at step n")."""
    chain, seen = [], exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    own = [
        e
        for e in chain
        if type(e).__module__.startswith("ort_hf")
        or (isinstance(e, (ValueError, RuntimeError)) and str(e).startswith("ort_hf"))
    ]
    lines = [
        line.strip()
        for line in str(exc).splitlines()
        if line.strip() and not line.startswith("Last complete checkpoint:")
    ]
    text = " / ".join(lines)
    return {
        "type": type(exc).__name__,
        "message": text[:300],
        "reason": condense(text, 300),  # the same, ORT's wrappers and C++ check dropped: the reason itself
        "from_ort_hf": bool(own),
        # ORTFallbackError: the engine could not export or run the model; otherwise one of ort_hf's checks.
        "ort_hf_error": type(own[0]).__name__ if own else None,
        "steps_done": steps_done,
    }
