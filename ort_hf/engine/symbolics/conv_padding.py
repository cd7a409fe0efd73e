"""``aten::_convolution_mode`` (a convolution with ``padding="same"`` or ``"valid"``) with explicit
``pads`` instead of ONNX's ``auto_pad``.

torch's symbolic (and ORT's, which wraps it) exports ``padding="same"`` as
``Conv(auto_pad="SAME_UPPER")``. ORT 1.19.2's CPU ``ConvGrad`` ignores ``auto_pad`` and reads only
``pads`` (none: zeros), so such a convolution trains with wrong input and weight gradients while
its forward is right; and ORT's CPU ``Conv`` refuses ``auto_pad`` with a dilation above 1
("Dilation not supported for AutoPadType::SAME_UPPER"). Users: CANINE, Perceiver, SeamlessM4T, the
PE audio models, EfficientNet / ALIGN.

torch pads a "same" convolution with ``total = dilation * (kernel - 1)`` per spatial axis, ``total
// 2`` before and the rest after (``Convolution.cpp``, ``_convolution_mode``), and allows "same"
with stride 1 only; those are the ``pads`` written here, so the Conv computes what torch computes
and ORT's gradient reads the same padding. "valid" is no padding. The kernel's spatial size must be
known at export (as for torch's symbolic). bfloat16 runs in float32, as ORT's own version of this
symbolic does.

It can go with the TorchScript exporter or ORT 1.19.2 (ORT's later ConvGrad reads ``auto_pad``).
"""

from __future__ import annotations

import torch

from .graph_ops import exporter_helpers, scalar_type


def _per_axis(values: list[int], axes: int) -> list[int]:
    return list(values) * axes if len(values) == 1 else list(values)


def convolution_mode(g, input, weight, bias, stride, padding, dilation, groups):  # noqa: A002
    symbolic_helper, _type_utils = exporter_helpers()
    stride = symbolic_helper._get_const(stride, "is", "stride")
    padding = symbolic_helper._get_const(padding, "s", "padding")
    dilation = symbolic_helper._get_const(dilation, "is", "dilation")
    groups = symbolic_helper._get_const(groups, "i", "groups")
    sizes = symbolic_helper._get_tensor_sizes(weight)
    kernel = sizes[2:] if sizes else None
    if not kernel or any(k is None for k in kernel):
        symbolic_helper._onnx_unsupported("aten::_convolution_mode with a kernel of unknown shape", input)
    axes = len(kernel)
    stride, dilation = _per_axis(stride, axes), _per_axis(dilation, axes)
    if padding == "valid":
        pads = [0] * (2 * axes)
    elif padding == "same":
        if any(s != 1 for s in stride):
            symbolic_helper._onnx_unsupported("aten::_convolution_mode with padding='same' and a stride", input)
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    else:
        symbolic_helper._onnx_unsupported(f"aten::_convolution_mode with padding={padding!r}", input)

    bfloat16 = scalar_type(input) == _type_utils.JitScalarType.BFLOAT16
    if bfloat16:
        input = g.op("Cast", input, to_i=torch.onnx.TensorProtoDataType.FLOAT)
        weight = g.op("Cast", weight, to_i=torch.onnx.TensorProtoDataType.FLOAT)
    has_bias = not symbolic_helper._is_none(bias)
    vector_bias = has_bias and symbolic_helper._get_tensor_rank(bias) == 1
    if vector_bias and bfloat16:
        bias = g.op("Cast", bias, to_i=torch.onnx.TensorProtoDataType.FLOAT)
    out = g.op(
        "Conv",
        input,
        weight,
        *([bias] if vector_bias else []),
        kernel_shape_i=kernel,
        strides_i=stride,
        pads_i=pads,
        dilations_i=dilation,
        group_i=groups,
    )
    if bfloat16:
        out = g.op("Cast", out, to_i=torch.onnx.TensorProtoDataType.BFLOAT16)
    if has_bias and not vector_bias:  # ONNX's Conv takes a 1-D bias only (as in torch's symbolic)
        out = g.op("Add", out, bias)
    return out
