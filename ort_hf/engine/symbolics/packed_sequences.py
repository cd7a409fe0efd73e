"""Symbolics for transformers' packed-sequence detection (``masking_utils.find_packed_sequence_indices``).

``aten::diff``
    torch has no symbolic at all. transformers' packed-sequence detection
    (``masking_utils.find_packed_sequence_indices``) calls ``torch.diff`` on ``position_ids``
    whenever a model that builds masks through ``masking_utils`` runs without an attention
    mask, and under tracing it always keeps the result.
``aten::cumsum``
    torch's symbolic hands boolean (and other non-float) inputs straight to ONNX ``CumSum``,
    which only accepts int32/int64/uint32/uint64/float/double: the same packed-sequence code
    does ``(position_diff != 1).cumsum(-1)`` on a bool tensor. torch promotes integral and
    bool inputs to int64; so does this symbolic.
``CumSum``'s gradient
    ORT 1.19.2 has none ("ORT has no gradient for ONNX op CumSum": gated delta-net layers'
    ``decay.cumsum``). Registered below: the gradient of an inclusive forward cumulative sum is
    the reverse cumulative sum of ``dY`` along the same axis. It holds for the ``CumSum`` nodes
    exported graphs carry, which come from :func:`cumsum` (torch's own symbolic is replaced) and
    never set ``exclusive`` or ``reverse``. Can go when ORT has a CumSum gradient (never, upstream
    is frozen).
"""

from __future__ import annotations

import torch

from .graph_ops import INT64_MAX, const, exporter_helpers, scalar_type, slice_axis


def diff(g, self, n=1, dim=-1, prepend=None, append=None):
    symbolic_helper, _type_utils = exporter_helpers()
    n = symbolic_helper._get_const(n, "i", "n")
    dim = symbolic_helper._get_const(dim, "i", "dim")
    x_type = scalar_type(self)

    def _as_self_type(t):
        t_type = scalar_type(t)
        if x_type is not None and t_type is not None and t_type != x_type:
            return g.op("Cast", t, to_i=x_type.onnx_type())
        return t

    parts = []
    if not symbolic_helper._is_none(prepend):
        parts.append(_as_self_type(prepend))
    parts.append(self)
    if not symbolic_helper._is_none(append):
        parts.append(_as_self_type(append))
    x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else self

    is_bool = x_type == _type_utils.JitScalarType.BOOL
    for _ in range(n):
        later = slice_axis(g, x, dim, 1, INT64_MAX)
        earlier = slice_axis(g, x, dim, 0, -1)
        # torch.diff on bool is logical_xor of neighbours
        x = g.op("Xor", later, earlier) if is_bool else g.op("Sub", later, earlier)
    return x


def cumsum(g, self, dim, dtype=None):
    symbolic_helper, _type_utils = exporter_helpers()
    JST = _type_utils.JitScalarType
    dim = symbolic_helper._get_const(dim, "i", "dim")
    if not symbolic_helper._is_none(dtype):
        target = JST(symbolic_helper._get_const(dtype, "i", "dtype"))
    else:
        src = scalar_type(self)
        floating = {JST.FLOAT, JST.DOUBLE, JST.HALF, JST.BFLOAT16}
        # torch: integral and bool inputs accumulate (and return) int64
        target = src if src in floating else JST.INT64
    src = scalar_type(self)
    x = self if src == target else g.op("Cast", self, to_i=target.onnx_type())
    return g.op("CumSum", x, const(g, dim, torch.int64))


def cumsum_gradient():
    """ORT gradient definition of ONNX ``CumSum`` (``_custom_gradient_registry``'s format); the axis
    ``I(1)`` is an integer, which ORT never differentiates."""
    return [
        ("CumSum", ["GO(0)", "I(1)"], ["GI(0)"], {"reverse": {"value": 1, "dtype": "int"}}),
    ]


GRADIENTS = {("", "CumSum"): cumsum_gradient}
