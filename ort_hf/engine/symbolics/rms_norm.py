"""``aten::rms_norm`` (``nn.RMSNorm``, ``F.rms_norm``: DiffLlama's group norm, any model on torch's
own module): torch has no ONNX symbolic for it below opset 23 (ONNX's ``RMSNormalization``), and
ORT 1.19 knows no opset 23.

In ORT's training exports (:func:`rms_norm`, entered into ORT's table only) it becomes ORT's
``SimplifiedLayerNormalization`` (ONNX domain, ORT's opset 1: ``X / sqrt(mean(X^2 over axis..) +
epsilon) * scale``), the op ORT itself fuses hand-written RMSNorms (Llama's) into and has a
gradient for. ``normalized_shape`` of any length (the op normalises from ``axis = -len`` on, its
scale has that shape), a missing weight as a constant scale of ones (the builder needs one), and
``eps=None`` as torch's ``finfo(opmath dtype).eps``. float32 and float64 only: half inputs are
upcast by torch, rounded back to half, then scaled in half, an order SimplifiedLayerNormalization
does not follow. For those, and in every other export (:func:`rms_norm_onnx`: ORT's op is not
standard ONNX), torch's own sequence is written out in standard ops (Cast, Mul, ReduceMean, Add,
Sqrt, Div, Cast, Mul), which ORT also differentiates.

Not bit-exact even in float32: torch multiplies by ``rsqrt(.)``, both forms here divide by
``sqrt(.)`` (one rounding apart). It can go when ORT training accepts ONNX opset 23
(``RMSNormalization``) or torch's TorchScript exporter maps ``rms_norm`` to something ORT
differentiates.
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers, scalar_type


def _arguments(input, normalized_shape, eps):
    symbolic_helper, _type_utils = exporter_helpers()
    shape = symbolic_helper._get_const(normalized_shape, "is", "normalized_shape")
    st = scalar_type(input, _type_utils.JitScalarType.FLOAT)
    opmath = st.dtype() if st.dtype() in (torch.float32, torch.float64) else torch.float32
    epsilon = torch.finfo(opmath).eps if symbolic_helper._is_none(eps) else symbolic_helper._get_const(eps, "f", "eps")
    return shape, st, opmath, epsilon


def rms_norm(g, input, normalized_shape, weight=None, eps=None):  # noqa: A002  (torch's argument names)
    """ORT's training exports: SimplifiedLayerNormalization where it computes what torch does."""
    symbolic_helper, _ = exporter_helpers()
    shape, st, opmath, epsilon = _arguments(input, normalized_shape, eps)
    dtype = st.dtype()
    if dtype in (torch.float32, torch.float64):
        scale = g.op("Constant", value_t=torch.ones(shape, dtype=dtype)) if symbolic_helper._is_none(weight) else weight
        out, inv_std = g.op(
            "SimplifiedLayerNormalization",
            input,
            scale,
            axis_i=-len(shape),
            epsilon_f=epsilon,
            stash_type_i=1,
            outputs=2,
        )
        out.setType(input.type())
        rank = symbolic_helper._get_tensor_rank(input)
        sizes = symbolic_helper._get_tensor_sizes(input)
        if rank is not None and sizes is not None:
            inv_std.setType(
                input.type().with_dtype(torch.float32).with_sizes(sizes[: rank - len(shape)] + [1] * len(shape))
            )
        return out
    return _decomposed(g, input, shape, weight, epsilon, st, opmath)


def rms_norm_onnx(g, input, normalized_shape, weight=None, eps=None):  # noqa: A002
    """Every other export: standard ONNX ops only."""
    shape, st, opmath, epsilon = _arguments(input, normalized_shape, eps)
    return _decomposed(g, input, shape, weight, epsilon, st, opmath)


def _decomposed(g, input, shape, weight, epsilon, st, opmath):
    """torch's own sequence (``layer_norm.cpp``'s ``rms_norm_symint``), in standard ONNX ops."""
    symbolic_helper, _type_utils = exporter_helpers()
    upcast = st.dtype() != opmath  # torch computes half types in float32
    x = g.op("Cast", input, to_i=_type_utils.JitScalarType.from_dtype(opmath).onnx_type()) if upcast else input
    axes = list(range(-len(shape), 0))
    square = g.op("Mul", x, x)  # torch's pow(x, 2) is x * x
    if g.opset >= 18:
        mean_sq = g.op("ReduceMean", square, const(g, axes, torch.int64), keepdims_i=1)
    else:  # axes an attribute below opset 18
        mean_sq = g.op("ReduceMean", square, axes_i=axes, keepdims_i=1)
    rms = g.op("Sqrt", g.op("Add", mean_sq, const(g, epsilon, opmath)))
    out = g.op("Div", x, rms)
    if upcast:
        out = g.op("Cast", out, to_i=st.onnx_type())
    return out if symbolic_helper._is_none(weight) else g.op("Mul", out, weight)
