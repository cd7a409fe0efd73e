"""A fused LM head (TRL's), computed inside the ORT graph on the non-ignored positions only.

A fused head (TRL's ``add_fused_lm_head``) makes ``model(..., labels=..., fused_lm_head=True)``
return per-token log-probabilities (and, on request, entropy, ``log(sum p^2)``, mean logit, whether
the label is the top-1 token) instead of logits. TRL's kernel is a custom autograd Function with
Python loops over tiles, which ORT cannot export. Here the same outputs come from plain tensor ops
that export: the backbone's hidden states, the rows whose next-token label is not -100 gathered
(``NonZero`` + ``Gather`` in the graph), the vocabulary projection and the softmax statistics on
those rows only, and the results put back in place (zero on ignored positions). The projection
never runs on an ignored position, so ORT never builds the ``(batch, seq, vocab)`` logits: the
label-sparsity idea, done in the graph.

What the head computes is a :class:`HeadSettings`; reading it from TRL's head is
``ort_hf/trl/fused_head.py``'s (nothing here knows TRL).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .module_with_loss import IGNORE_INDEX, base_model

# Per-token outputs the head can compute besides log_probs (TRL's FusedCausalLMOutput fields).
OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


@dataclass(frozen=True)
class HeadSettings:
    """What a fused head computes for one model (for TRL's: what ``add_fused_lm_head`` was told, or
    derived from the config)."""

    temperature: float
    cast_lm_head_to_fp32: bool
    outputs: tuple[str, ...]
    final_logit_softcapping: float | None
    logit_scale: float
    backbone_attr: str
    moe_router_logits: bool  # the config asks for router logits (TRL then adds the load-balancing loss)
    output_type: Callable[..., Any]  # what the head returns, built from keyword fields (TRL's FusedCausalLMOutput)


class FusedLMHeadModule(nn.Module):
    """The trainer's model (PEFT or not) with its fused head swapped for :func:`fused_head_forward`
    while it runs: what ORT exports. Called as TRL calls the model (``fused_lm_head=True``, labels);
    returns ``settings.output_type``."""

    def __init__(self, model: nn.Module, settings: HeadSettings):
        super().__init__()
        self.model = model
        self.settings = settings

    def forward(self, **inputs):
        with _exportable_head(base_model(self.model), self.settings):
            return self.model(**inputs)


@contextlib.contextmanager
def _exportable_head(model: nn.Module, settings: HeadSettings):
    installed_forward = vars(model)["forward"]

    def forward(self, *args, fused_lm_head=False, **kwargs):
        if not fused_lm_head:
            return installed_forward(*args, **kwargs)
        return fused_head_forward(self, settings, *args, **kwargs)

    model.forward = types.MethodType(forward, model)
    try:
        yield
    finally:
        model.forward = installed_forward


def fused_head_forward(
    model: nn.Module, settings: HeadSettings, *args, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs
):
    """TRL's ``_fused_forward`` (``fused_lm_head=True``) in ops ORT exports: the vocabulary projection
    and the softmax statistics on the non-ignored rows only."""
    kwargs["use_cache"] = False
    hidden = getattr(model, settings.backbone_attr)(*args, **kwargs).last_hidden_state
    if shift_labels is None:
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    else:
        labels = shift_labels
    mask = labels != IGNORE_INDEX
    flat_mask = mask.reshape(-1)
    used = flat_mask.nonzero().squeeze(-1)  # the positions whose label counts
    # One more row (position 0's) so the gather back below has a row to read even when no label counts.
    rows = torch.cat([used, used.new_zeros(1)])
    hidden_rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
    targets = labels.reshape(-1).clamp(min=0).index_select(0, rows)
    per_row = _row_statistics(model.get_output_embeddings(), hidden_rows, targets, settings)
    # Back in place: the k-th used position reads row k; ignored positions are zeroed by the mask (a
    # Gather and a Mul, whose gradients ORT has; a zero constant in the graph would be given one).
    slot = (flat_mask.long().cumsum(0) - 1).clamp(min=0)
    per_token = {}
    for name, value in per_row.items():
        value = value.index_select(0, slot).view(mask.shape)
        per_token[name] = value & mask if value.dtype == torch.bool else value * mask.to(value.dtype)
    log_probs = per_token["log_probs"]
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return settings.output_type(loss=-log_probs.sum() / count, label_mask=mask, **per_token)


def _row_statistics(
    lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, settings: HeadSettings
) -> dict[str, torch.Tensor]:
    """TRL's per-token outputs for ``hidden`` rows (N, H) and their ``targets`` (N,)."""
    weight, bias = lm_head.weight, lm_head.bias
    autocast = contextlib.nullcontext()
    if settings.cast_lm_head_to_fp32:
        hidden = hidden.float()
        autocast = torch.autocast(hidden.device.type, enabled=False)
    with autocast:
        logits = nn.functional.linear(hidden, weight.to(hidden.dtype), None if bias is None else bias.to(hidden.dtype))
    z = logits.float()  # TRL folds its tiles in float32
    if settings.logit_scale != 1.0:
        z = z * settings.logit_scale
    if settings.final_logit_softcapping is not None:
        z = settings.final_logit_softcapping * torch.tanh(z / settings.final_logit_softcapping)
    if settings.temperature != 1.0:
        z = z / settings.temperature
    log_p = torch.log_softmax(z, dim=-1)
    out = {"log_probs": log_p.gather(1, targets.unsqueeze(1)).squeeze(1)}
    if "entropy" in settings.outputs:
        out["entropy"] = -(log_p.exp() * log_p).sum(-1)
    if "log_sum_sq_probs" in settings.outputs:
        out["log_sum_sq_probs"] = torch.logsumexp(2 * log_p.detach(), dim=-1)
    if "mean_logits" in settings.outputs:
        out["mean_logits"] = z.detach().mean(-1)
    if "is_top1" in settings.outputs:
        # argmax takes the first maximum, as TRL's kernel does (a tie with an earlier token is not top-1)
        out["is_top1"] = z.detach().argmax(-1) == targets
    return out


class FusedHeadCaller:
    """The engine module as the trainer's ``compute_loss`` (TRL's) calls it. On CPU the engine drops
    trailing all-padding columns before ORT runs (their labels are -100); the per-token outputs are given
    those columns back, as zeros, which is what TRL's head returns there."""

    def __init__(self, engine_module: nn.Module, no_grad_model: nn.Module | None = None):
        self.engine_module, self.no_grad_model = engine_module, no_grad_model
        self.label_density: float | None = None  # share of the label positions the head computed, last call

    def __call__(self, **inputs):
        if self.no_grad_model is not None and not torch.is_grad_enabled():
            # A forward without a backward inside the training step (KTO's KL estimate): TRL's head in
            # PyTorch on the same weights, as DPO's reference. Through the engine it would be a second
            # export (ORT's inference graph) and its memory, for a forward TRL already tiles.
            return self.no_grad_model(**inputs)
        outputs = self.engine_module(**inputs)
        self.label_density = float(outputs["label_mask"].float().mean())
        labels = inputs.get("shift_labels")
        width = labels.shape[-1] if labels is not None else inputs["labels"].shape[-1] - 1
        for name in ("log_probs", "label_mask", *OPTIONAL_OUTPUTS):
            value = outputs.get(name)
            if value is not None and value.shape[-1] < width:
                outputs[name] = torch.cat([value, value.new_zeros(*value.shape[:-1], width - value.shape[-1])], dim=-1)
        return outputs


def head_weight_name(module: nn.Module) -> str:
    """The parameter name of the LM head's weight in ``module`` (a ``FusedLMHeadModule``), as ORT's
    graph names it (tied weights carry the first name)."""
    weight = base_model(module.model).get_output_embeddings().weight
    return next(name for name, param in module.named_parameters(remove_duplicate=True) if param is weight)


def head_rows_report(graph, module: FusedLMHeadModule, caller: FusedHeadCaller) -> dict[str, float]:
    """One-time facts for the logs: the share of label positions the head computed (first batch),
    and whether the graph ORT built runs the vocabulary projection on those rows only (read from it)."""
    from .lm_head_graph_check import projection_on_gathered_rows

    return {
        "ort/head_label_density": round(caller.label_density, 4),
        "ort/head_on_used_rows": float(projection_on_gathered_rows(graph, head_weight_name(module))),
    }
