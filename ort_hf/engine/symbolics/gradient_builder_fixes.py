"""Ops whose ORT gradient builder fails on what torch exports: each is exported so that ORT can
build its gradient.

``aten::where``
    ORT's Where gradient (``Where(cond, dY, 0)``) does not sum over broadcast dimensions, so
    a data input that ``torch.where`` broadcasts gets a gradient of the output's shape and the
    backward graph breaks upstream. T5 (and any model whose SDPA mask is built by
    transformers' ``create_position_bias_mask`` from a learned bias and a padding mask) fails
    with ``Squeeze ... Dimension of input 0 must be 1``. Non-constant data inputs that may be
    broadcast are expanded to the output shape first; Expand's gradient reduces correctly.
``aten::layer_norm``
    ORT's own layer_norm symbolic passes a missing bias (``nn.LayerNorm(bias=False)``, e.g.
    ModernBERT) or weight through as an empty input; the gradient builder then names every
    such bias gradient ``_grad`` and fails (``Duplicate definition of name (_grad)``).
``aten::logsumexp`` (training exports only)
    ORT's ``ReduceLogSumExp`` gradient re-expands the reduced axes with an attribute-form
    ``Unsqueeze`` when ``keepdims=0``, which is invalid from opset 13 on: building the
    gradient graph fails (``Unsqueeze ... has input size 1 not in range [min=2, max=2]``) for
    any loss with ``logsumexp`` (z-losses, router losses). The reduction is exported with
    ``keepdims=1`` and squeezed afterwards; ORT's gradient then needs no Unsqueeze.
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers, scalar_type, torch_symbolics


def _maybe_broadcast(value, others) -> bool:
    """Whether ``value`` may be smaller than the broadcast of itself with ``others``.

    False only when the static types prove it: same rank as every other operand, and no dim
    that is 1 where another operand's dim is not known to be 1.
    """
    symbolic_helper, _ = exporter_helpers()
    sizes = symbolic_helper._get_tensor_sizes(value)
    if sizes is None:
        return True
    for other in others:
        other_sizes = symbolic_helper._get_tensor_sizes(other)
        if other_sizes is None or len(other_sizes) > len(sizes):
            return True
        offset = len(sizes) - len(other_sizes)
        for i, o in enumerate(other_sizes):
            if sizes[offset + i] == 1 and o != 1:
                return True
    return False


def _broadcast_shape(g, values, ranks):
    """Run-time broadcast shape (1-D int64) of ``values`` whose ranks are all known."""
    rank = max(ranks)
    one = const(g, 1, torch.int64)
    result = None
    for v, r in zip(values, ranks):
        shape = g.op("Shape", v)
        if r < rank:
            shape = g.op("Concat", const(g, [1] * (rank - r), torch.int64), shape, axis_i=0)
        # broadcast(a, b) per dim = a where b == 1 else b (valid for broadcastable inputs, 0 included)
        result = shape if result is None else g.op("Where", g.op("Equal", shape, one), result, shape)
    return result


def where(g, condition, self=None, other=None, _outputs=None):
    symbolic_helper, _ = exporter_helpers()
    if symbolic_helper._is_none(self) or symbolic_helper._is_none(other):
        # torch.where(cond): the nonzero form; nothing to differentiate, torch's symbolic is fine.
        return torch_symbolics(9).where(g, condition, self, other, _outputs)
    if not symbolic_helper._is_bool(condition):
        condition = g.op("Cast", condition, to_i=torch.onnx.TensorProtoDataType.BOOL)
    # ORT's Where gradient (Where(cond, dY, 0)) does not reduce broadcast dimensions, so a
    # data input smaller than the output gets a gradient of the output's shape and the
    # backward graph fails further up (T5's relative position bias under SDPA:
    # "Squeeze ... Dimension of input 0 must be 1"). Expanding such an input to the output
    # shape first moves the reduction into Expand's gradient, which ORT gets right.
    # Constants never need a gradient and are left alone.
    operands = [condition, self, other]
    needs = [
        i
        for i in (1, 2)
        if not symbolic_helper._is_constant(operands[i])
        and _maybe_broadcast(operands[i], [operands[j] for j in range(3) if j != i])
    ]
    if needs:
        ranks = [symbolic_helper._get_tensor_rank(v) for v in operands]
        if all(r is not None for r in ranks):
            shape = _broadcast_shape(g, operands, ranks)
        else:
            shape = g.op("Shape", g.op("Expand", g.op("Expand", condition, g.op("Shape", self)), g.op("Shape", other)))
        for i in needs:
            operands[i] = g.op("Expand", operands[i], shape)
    return g.op("Where", *operands)


def layer_norm(g, input, normalized_shape, weight, bias, eps, cudnn_enable):
    symbolic_helper, _ = exporter_helpers()
    # ORT's own layer_norm symbolic (re-registered by every ORTModule construction) passes a
    # missing weight or bias through as an empty input name. A missing scale is invalid ONNX;
    # a missing bias makes ORT's gradient builder name the bias gradient "_grad" for every
    # such LayerNorm ("Duplicate definition of name (_grad)": ModernBERT, any
    # nn.LayerNorm(bias=False)). Missing ones become constant ones / zeros instead.
    normalized_shape = symbolic_helper._get_const(normalized_shape, "is", "normalized_shape")
    eps = symbolic_helper._get_const(eps, "f", "eps")
    input_type = scalar_type(input)
    dtype = input_type.dtype() if input_type is not None else torch.float32
    if symbolic_helper._is_none(weight):
        weight = g.op("Constant", value_t=torch.ones(normalized_shape, dtype=dtype))
    if symbolic_helper._is_none(bias):
        bias = g.op("Constant", value_t=torch.zeros(normalized_shape, dtype=dtype))
    # All three outputs, as ORT's version does: LayerNormalizationGrad reads mean and inv_std.
    out, _mean, _inv_std = g.op(
        "LayerNormalization", input, weight, bias, epsilon_f=eps, axis_i=-len(normalized_shape), outputs=3
    )
    return out


def logsumexp(g, self, dim, keepdim):
    symbolic_helper, _ = exporter_helpers()
    dims = symbolic_helper._maybe_get_const(dim, "is")
    keep = bool(symbolic_helper._maybe_get_const(keepdim, "i"))
    if symbolic_helper._is_value(dims) or g.opset >= 18:
        return torch_symbolics(g.opset).logsumexp(g, self, dim, keepdim)  # not the case ORT 1.19 trains
    dims = list(dims) if dims else list(range(symbolic_helper._get_tensor_rank(self)))
    out = g.op("ReduceLogSumExp", self, axes_i=dims, keepdims_i=1)
    return out if keep else g.op("Squeeze", out, const(g, dims, torch.int64))
