"""Whether a causal LM's cross-entropy can be computed by :mod:`.chunked_lm_loss` from its backbone's
hidden states: only where that is, on the first batch, the model's own loss.

The fused loss skips the model's ``forward`` after its backbone: it projects the backbone's last
hidden states with the output embedding's weight and bias. That is the model's loss only where its
logits are exactly that projection (no soft-capping, logit scale or other step in between, which
some families add) and the cross-entropy of those logits is its loss (``loss_choice`` has checked
the second). The first is checked here on the first batch, in PyTorch, once.
"""

from __future__ import annotations

import torch
from torch import nn

from .._batches import first_rows_of
from .._model_state import side_effect_free
from .loss_choice import PROBE_MIN_ROWS, recall_check
from .module_with_loss import CROSS_ENTROPY, ModuleWithLoss, _output, base_model


def chunked_head_refusal(module: ModuleWithLoss, batch: dict, pythonop: bool, memo=None) -> str | None:
    """Why ``module``'s cross-entropy cannot be the fused chunked one for this model, or None.
    ``memo``: as for ``loss_choice.choose_loss``."""
    model = module.model
    if not pythonop:
        return "ORT's PythonOp is unavailable (custom autograd off, or its extension missing: `ort-hf doctor`)"
    if module.loss_kind != CROSS_ENTROPY or module.label_smoothing or not module.shift_labels:
        return "the loss is not a causal LM's plain cross-entropy"
    if base_model(model) is not model:
        return "a PEFT model (the head goes through its wrapper)"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if type(head) is not nn.Linear or not isinstance(backbone, nn.Module) or backbone is model:
        return f"{type(model).__name__} has no plain nn.Linear head over a backbone"
    if head.weight.dtype != torch.float32 or torch.is_autocast_enabled(head.weight.device.type):
        return "the head is not computed in float32"
    # Any row shows a step between the head's projection and the logits.
    rows = first_rows_of(batch, PROBE_MIN_ROWS)
    rows = {k: v for k, v in rows.items() if k not in ("labels", "num_items_in_batch")}
    found = recall_check(
        memo, "logits_are_head_projection", rows, {}, lambda: _logits_are_projection(model, head, backbone, rows)
    )
    if not found["same"]:
        return f"{type(model).__name__}'s logits are not its head's projection of its backbone's hidden states"
    return None


def _logits_are_projection(model, head, backbone, rows: dict) -> dict:
    with side_effect_free(model):  # each block starts from the same RNG state: the same dropout masks
        logits = _output(model(**rows), "logits")
    with side_effect_free(model):
        hidden = _output(backbone(**rows), "last_hidden_state")
    if hidden.shape[-1] != head.in_features:  # a step between resizes them (ELECTRA's generator head)
        return {"same": False}
    projected = head(hidden)
    same = logits.shape == projected.shape and torch.allclose(logits.float(), projected.float(), rtol=1e-5, atol=1e-5)
    return {"same": bool(same)}


def fused_in_graph(graph) -> bool:
    """Whether ORT's training graph runs the fused loss as a PythonOp (not inlined: its forward's
    chunk loop, traced, would be fixed to the first batch's length)."""
    from .chunked_lm_loss import ChunkedLinearCrossEntropy

    graph = getattr(graph, "graph", graph)
    name = f"{ChunkedLinearCrossEntropy.__module__}.{ChunkedLinearCrossEntropy.__qualname__}"
    return any(
        node.op_type == "PythonOp" and any(a.name == "func_name" and a.s.decode() == name for a in node.attribute)
        for node in graph.node
    )
