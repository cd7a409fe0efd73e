"""``aten::scatter``: a ``bool`` fill value made traceable, and the ``reduce=`` forms exported
exactly or refused.

**The bool value.** The sparse-attention indexers of DeepSeek-V3.2, GLM-MoE-DSA, HY-V4 and AXK2
build their top-k mask with ``ones(..., dtype=bool).scatter(-1, topk_indices, False)``. torch's
tracer records the Python ``False`` as a ``bool`` constant, which matches no ``aten::scatter``
schema (``value`` is a ``Scalar``), and the trace itself dies in alias analysis ("We don't have an
op for aten::scatter but it isn't a special case"), before any symbolic runs. While traced (only
then), ``torch.scatter`` / ``Tensor.scatter`` / ``Tensor.scatter_`` are handed ``int(value)`` for a
bool ``value``: the same fill for every dtype (bool ``True``/``False`` is ``1``/``0`` cast to the
tensor's dtype either way), which torch's ``scatter.value`` symbolic exports as
``ScatterElements``. Can go when torch's tracer types a bool ``Scalar`` (not as of torch 2.13).

**The reduce forms** (``reduce="add"`` / ``"multiply"``) have no symbolic in torch (its ``scatter``
takes four arguments). ONNX ``ScatterElements`` has the ``reduction``, but ORT's gradient of
``ScatterElements`` ignores it (it differentiates a plain scatter), while torch defines no
derivative for these forms at all (backward raises). So they are exported only for tensors that
cannot need a gradient (integer or bool, or traced as not requiring one), and refused otherwise,
rather than given a gradient torch does not have. The forms without ``reduce`` keep torch's
symbolic (``ScatterElements``, whose ORT gradient is right for them).
"""

from __future__ import annotations

import torch

from ..compat import _patch
from .graph_ops import exporter_helpers, scalar_type, torch_symbolics

_REDUCTIONS = {"add": "add", "multiply": "mul"}


def _bool_value_as_int(original):
    def scatter(*args, **kwargs):
        if torch.jit.is_tracing():
            if len(args) > 3 and type(args[3]) is bool:
                args = (*args[:3], int(args[3]), *args[4:])
            if type(kwargs.get("value")) is bool:
                kwargs["value"] = int(kwargs["value"])
        return original(*args, **kwargs)

    return scatter


def install_bool_value_fix() -> None:
    """Make ``scatter`` with a bool fill value traceable (idempotent; eager calls are untouched)."""
    _patch(torch, "scatter", _bool_value_as_int)
    for method in ("scatter", "scatter_"):
        _patch(torch.Tensor, method, _bool_value_as_int)


def _may_need_gradient(value) -> bool:
    symbolic_helper, _ = exporter_helpers()
    if not symbolic_helper._is_value(value) or not symbolic_helper._is_tensor(value):
        return False  # a Python scalar
    st = scalar_type(value)
    if st is not None and not (st.dtype().is_floating_point or st.dtype().is_complex):
        return False
    requires_grad = value.type().requires_grad()
    return requires_grad is None or bool(requires_grad)


def scatter(g, self, dim, index, src, reduce=None):  # noqa: A002  (torch's argument names)
    symbolic_helper, _ = exporter_helpers()
    if reduce is None or symbolic_helper._is_none(reduce):
        return torch_symbolics(11).scatter(g, self, dim, index, src)
    mode = symbolic_helper._maybe_get_const(reduce, "s")
    if mode not in _REDUCTIONS:
        symbolic_helper._onnx_unsupported(f"aten::scatter with reduce={mode!r}", self)
    if _may_need_gradient(self) or _may_need_gradient(src):
        symbolic_helper._onnx_unsupported(
            f"aten::scatter with reduce={mode!r} on a tensor that may need a gradient (torch defines none, and ORT's "
            "ScatterElements gradient would ignore the reduction)",
            self,
        )
    axis = symbolic_helper._get_const(dim, "i", "dim")
    if not symbolic_helper._is_tensor(src) or symbolic_helper._get_tensor_rank(src) == 0:  # a scalar value
        st = scalar_type(self)
        if st is None:
            symbolic_helper._onnx_unsupported("aten::scatter with reduce on a tensor of unknown dtype", self)
        src = g.op("Cast", src, to_i=st.onnx_type())
        src = g.op("Expand", src, g.op("Shape", index))
    return g.op("ScatterElements", self, index, src, axis_i=axis, reduction_s=_REDUCTIONS[mode])
