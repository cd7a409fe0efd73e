"""Which loss ModuleWithLoss computes: its cross-entropy only where that is the model's own loss.

The Trainer trains on the model's loss unless a ``compute_loss_func`` or label smoothing
replaces it. ModuleWithLoss's cross-entropy (the form ORT's label sparsity needs) stands in for
the model's loss only when the model is a transformers head whose loss path nobody changed, and
its loss on the first batch, computed once in PyTorch, equals that cross-entropy of its logits.
Everything else (a class-weighted or focal loss, an auxiliary router loss, an in-code module, a
loss from other inputs than ``labels``) trains on the model's own loss inside the ORT graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._batches import first_rows_of
from .._model_state import side_effect_free
from .module_with_loss import CROSS_ENTROPY, IGNORE_INDEX, MODEL_LOSS, USER_LOSS, ModuleWithLoss, base_model, model_loss

PROBE_ROWS = 4  # the most rows of the first batch the check runs on (see _rows_with_labels)
PROBE_MIN_ROWS = 2  # the fewest: a BatchNorm's training statistics need two rows


@dataclass(frozen=True)
class LossChoice:
    kind: str  # one of LOSS_KINDS
    reason: str | None = None  # why the model's own loss is kept
    # For the cross-entropy: whether the model's loss divides by num_items_in_batch (transformers'
    # loss_function) or takes its own batch mean (e.g. BertForMaskedLM's inline CrossEntropyLoss).
    per_num_items: bool = True


def choose_loss(module: ModuleWithLoss, batch: dict, num_items_in_batch=None, memo=None) -> LossChoice:
    """What ``module`` should compute for the model and the first batch (see the module docstring).
    ``memo``: an ``engine.first_batch_memo`` whose recorded outcome of the first-batch forwards stands in
    for running them (the export cache's)."""
    labels = batch.get("labels")
    if module.compute_loss_func is not None:
        return LossChoice(USER_LOSS)
    if module.label_smoothing and labels is not None and module.is_class_label(labels):
        return LossChoice(CROSS_ENTROPY)  # the Trainer's LabelSmoother replaces the model's loss too
    reason = _not_a_standard_head(module, labels)
    if reason:
        rows = first_rows_of(batch, PROBE_MIN_ROWS)
        recall_check(memo, "returns_loss", rows, {}, lambda: _check_returns_loss(module, rows))
        return LossChoice(MODEL_LOSS, reason)
    rows = _rows_with_labels(batch, module)
    facts = {
        "two_classes": _two_classes(rows, module),
        "num_items_in_batch": num_items_in_batch is not None,
        "model_accepts_loss_kwargs": module.model_accepts_loss_kwargs,
        "shift_labels": module.shift_labels,
        "label_smoothing": module.label_smoothing,
    }
    found = recall_check(
        memo, "loss_choice", rows, facts, lambda: vars(_compare_on_first_batch(module, rows, num_items_in_batch))
    )
    return LossChoice(**found)


def recall_check(memo, check: str, rows: dict, facts: dict, compute):
    """``compute()``, or without running it the outcome ``memo`` recorded for the same check."""
    return compute() if memo is None else memo.recall(check, rows, facts, compute)


def _check_returns_loss(module: ModuleWithLoss, rows: dict) -> dict:
    """Raise the Trainer's error for a model that returns no loss, before ORT exports it."""
    with side_effect_free(module.model):
        model_loss(module.model(**rows), rows)
    return {"returns_loss": True}


def _not_a_standard_head(module: ModuleWithLoss, labels) -> str | None:
    from transformers import PreTrainedModel

    model = base_model(module.model)  # a PEFT wrapper passes labels through to the model's own loss
    name = type(model).__name__
    if labels is None:
        return "the batch has no `labels` (the model computes its loss from other inputs)"
    if not module.is_class_label(labels):
        return "the labels are not class ids (regression or multi-label targets)"
    if not isinstance(model, PreTrainedModel):
        return f"{name} is not a transformers model, so its loss can be anything"
    if not type(model).forward.__module__.startswith("transformers."):
        return f"{name}.forward is defined outside transformers ({type(model).forward.__module__})"
    if "_loss_function" in vars(model) or type(model).loss_function is not PreTrainedModel.loss_function:
        return f"{name}.loss_function is replaced"
    return None


def _compare_on_first_batch(module: ModuleWithLoss, rows: dict, num_items_in_batch) -> LossChoice:
    rows = dict(rows)
    labels = rows.pop("labels")
    count = int((module.token_labels(labels) != IGNORE_INDEX).sum())
    probe_items = None
    if module.model_accepts_loss_kwargs and num_items_in_batch is not None:
        # Any count but the rows' own shows whether the model divides by num_items_in_batch.
        probe_items = torch.tensor(count + 1, device=labels.device)
        rows["num_items_in_batch"] = probe_items
    with side_effect_free(module.model):
        outputs = module.model(labels=labels, **rows)
        own = model_loss(outputs, rows).float()
        try:
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
            summed = module.loss_from_outputs({"logits": logits}, labels, count) * count
        except (KeyError, IndexError, RuntimeError, ValueError, TypeError) as exc:
            return LossChoice(
                MODEL_LOSS, f"its outputs do not give a cross-entropy over its labels ({type(exc).__name__}: {exc})"
            )
    for per_num_items, divisor in ((True, probe_items), (False, count)):
        if (
            divisor is not None
            and own.shape == summed.shape
            and torch.allclose(own, summed / divisor, rtol=1e-4, atol=1e-6)
        ):
            return LossChoice(CROSS_ENTROPY, per_num_items=per_num_items)
    return LossChoice(
        MODEL_LOSS,
        f"its loss on the first batch ({own.flatten()[0].item():.6g}) is not the "
        f"cross-entropy of its logits ({(summed / count).item():.6g}): it weights, adds "
        "to or normalises it differently",
    )


def _used_labels(rows: dict, module: ModuleWithLoss) -> torch.Tensor:
    labels = module.token_labels(rows["labels"])
    return labels[labels != IGNORE_INDEX]


def _two_classes(rows: dict, module: ModuleWithLoss) -> bool:
    return _used_labels(rows, module).unique().numel() >= 2


def _rows_with_labels(batch: dict, module: ModuleWithLoss) -> dict:
    """The fewest first rows of the batch (from ``PROBE_MIN_ROWS`` to ``PROBE_ROWS``) whose used
    labels hold two classes, so that a loss weighting classes differently shows; the first
    ``PROBE_ROWS`` rows when fewer hold fewer classes, and the whole batch when those have no used
    label."""
    for rows in range(PROBE_MIN_ROWS, PROBE_ROWS + 1):
        cut = first_rows_of(batch, rows)
        if _two_classes(cut, module) or rows == PROBE_ROWS and _used_labels(cut, module).numel():
            return cut
    return dict(batch)
