"""ONNX export symbolics that ORTModule needs on current torch to train Hugging Face models.

ORTModule exports the model with torch's TorchScript exporter and then builds the backward
graph itself from the exported ONNX forward. A few of torch's symbolics produce graphs that
export fine but that ORT cannot differentiate, or that are not valid ONNX; others are
missing. The replacements here are registered with ``torch.onnx.register_custom_op_symbolic``
(custom symbolics take precedence over torch's own for the opset they are registered in) by
:func:`register_training_symbolics`, which the engine calls once per ONNX opset before the
first export.

``aten::scaled_dot_product_attention``
    transformers' default attention (``attn_implementation="sdpa"``). torch's opset-14
    symbolic emits ``Dropout`` with one output and no ``training_mode`` input; ORT's Dropout
    gradient needs the mask output, so building the gradient graph fails
    (``gradient_builder_base.h ... i < node_->OutputDefs().size()``) as soon as attention
    dropout is non-zero. It also rejects ``enable_gqa=True`` (transformers passes it for
    grouped-query attention when there is no attention mask), turns fully masked rows of a
    boolean mask into 0 through ``Where(IsNaN)`` (the gradients come out NaN under ORT) and
    leaves fully ``-inf`` rows of a float mask NaN (torch gives 0). The decomposition
    below is differentiable by ORT and matches torch's math (rows where every key is masked
    give 0 output and 0 gradient, for boolean and for float ``-inf`` masks alike).
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
``aten::gelu`` (training exports only)
    ``gelu(x @ W + b)``, exact GELU after a linear layer (BERT-style FFNs and MLM heads), is
    exported as ORT's ``BiasGelu(x @ W, b)``. ORT 1.19 has the same fusion, but it only matches
    ONNX ``Add`` of opset 7, so from opset 14 on it never fires and ``Gelu`` stays apart. That
    matters to label sparsity: ORT's compute optimizer moves the labels' ``ShrunkenGather`` up
    the graph only after ``UpStreamReshape`` has flattened ``[batch, seq, hidden]`` to
    ``[tokens, hidden]`` above it, and that pass goes through ``BiasGelu`` but not ``Gelu``.
    With it (and opset 16, see ``ORTOptions.opset_version``), the gather reaches the last
    encoder layer's attention output: that layer's feed-forward block and the MLM head's
    transform run on the labelled tokens only. Other GELUs keep torch's symbolic. Registered
    in ORT's table only (ORTModule enters it into torch's registry for its training opset), so
    inference exports at another opset (:mod:`.export`, 17 by default) keep torch's GELU.

ORTModule re-registers its own symbolic table (which has ``layer_norm``, and
``scaled_dot_product_attention`` when ``ORTMODULE_ATEN_SDPA_FALLBACK`` is set) on every
construction, which would put ORT's versions back over torch's registry. So the symbolics
here are also entered into ORT's table (``CustomOpSymbolicRegistry.register``), provided
:func:`register_training_symbolics` runs after ``onnxruntime.training.ortmodule`` is imported.
"""

from __future__ import annotations

import math
import sys
import threading

import torch

_DONE: set[int] = set()
_LOCK = threading.Lock()
_INT64_MAX = 2**63 - 1


def _torch_symbolics(opset: int):
    """torch's own ``symbolic_opset<opset>`` module (under ``_internal`` since torch 2.9)."""
    import importlib

    return importlib.import_module(f"torch.onnx._internal.torchscript_exporter.symbolic_opset{opset}")


def _helpers():
    """torch's TorchScript exporter helpers (under ``_internal`` since torch 2.9)."""
    from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

    return symbolic_helper, _type_utils


# --------------------------------------------------------------------------------------
# small graph-building helpers
# --------------------------------------------------------------------------------------


def _const(g, value, dtype):
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))


def _scalar_type(value, default=None):
    _, _type_utils = _helpers()
    undefined = _type_utils.JitScalarType.UNDEFINED
    st = _type_utils.JitScalarType.from_value(value, undefined)
    if st == undefined:
        return default
    return st


def _shape_slice(g, shape, start, end):
    """``shape[start:end]`` of a 1-D int64 shape tensor."""
    return g.op(
        "Slice",
        shape,
        _const(g, [start], torch.int64),
        _const(g, [end], torch.int64),
        _const(g, [0], torch.int64),
    )


def _reduce_max_last(g, x):
    """ReduceMax over the last axis, keepdims (axes moved from attribute to input in opset 18)."""
    if g.opset >= 18:
        return g.op("ReduceMax", x, _const(g, [-1], torch.int64), keepdims_i=1)
    return g.op("ReduceMax", x, axes_i=[-1], keepdims_i=1)


def _slice_axis(g, x, axis, start, end):
    return g.op(
        "Slice",
        x,
        _const(g, [start], torch.int64),
        _const(g, [end], torch.int64),
        _const(g, [axis], torch.int64),
    )


# --------------------------------------------------------------------------------------
# aten::scaled_dot_product_attention
# --------------------------------------------------------------------------------------


def _repeat_heads(g, x, n_rep, rank):
    """``x.repeat_interleave(n_rep, dim=-3)`` for x of shape (..., H, S, E).

    ``n_rep`` is an int or a 1-element int64 tensor value. Batch and sequence sizes stay
    dynamic.
    """
    head_axis = rank - 3
    unsqueezed = g.op("Unsqueeze", x, _const(g, [head_axis + 1], torch.int64))  # (..., H, 1, S, E)
    if isinstance(n_rep, int):
        expand_shape = _const(g, [1] * (head_axis + 1) + [n_rep, 1, 1], torch.int64)
    else:
        parts = []
        if head_axis + 1:
            parts.append(_const(g, [1] * (head_axis + 1), torch.int64))
        parts += [n_rep, _const(g, [1, 1], torch.int64)]
        expand_shape = g.op("Concat", *parts, axis_i=0)
    expanded = g.op("Expand", unsqueezed, expand_shape)  # (..., H, n, S, E)
    shape = g.op("Shape", x)
    target = [_const(g, [-1], torch.int64), _shape_slice(g, shape, rank - 2, _INT64_MAX)]
    if head_axis:
        target.insert(0, _shape_slice(g, shape, 0, head_axis))
    return g.op("Reshape", expanded, g.op("Concat", *target, axis_i=0))


def _causal_keep(g, query, key, rank_q, rank_k):
    """Bool (L, S) mask, True where key position <= query position (top-left aligned, like torch)."""
    q_len = g.op("Gather", g.op("Shape", query), _const(g, rank_q - 2, torch.int64), axis_i=0)
    k_len = g.op("Gather", g.op("Shape", key), _const(g, rank_k - 2, torch.int64), axis_i=0)
    zero, one = _const(g, 0, torch.int64), _const(g, 1, torch.int64)
    rows = g.op("Unsqueeze", g.op("Range", zero, q_len, one), _const(g, [1], torch.int64))
    cols = g.op("Unsqueeze", g.op("Range", zero, k_len, one), _const(g, [0], torch.int64))
    return g.op("GreaterOrEqual", rows, cols)


def _sdpa(g, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    symbolic_helper, _type_utils = _helpers()
    JST = _type_utils.JitScalarType
    q_type = _scalar_type(query, JST.FLOAT)
    is_causal = bool(symbolic_helper._maybe_get_const(is_causal, "b"))
    enable_gqa = False if symbolic_helper._is_none(enable_gqa) else bool(symbolic_helper._maybe_get_const(enable_gqa, "b"))
    rank_q = symbolic_helper._get_tensor_rank(query) or 4
    rank_k = symbolic_helper._get_tensor_rank(key) or 4

    key, value = _kv_heads_like_query(g, query, key, value, rank_q, rank_k, enable_gqa)
    perm = list(range(rank_k))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scaled_query = g.op("Mul", query, _attention_scale(g, query, scale, q_type, rank_q))
    scores = g.op("MatMul", scaled_query, g.op("Transpose", key, perm_i=perm))
    keep = _causal_keep(g, query, key, rank_q, rank_k) if is_causal else None
    mask = None if symbolic_helper._is_none(attn_mask) else attn_mask
    scores, zero_masked_rows = _masked_scores(g, scores, mask, keep, q_type)
    weights = zero_masked_rows(g.op("Softmax", scores, axis_i=-1))
    weights = _attention_dropout(g, weights, symbolic_helper._maybe_get_const(dropout_p, "f"))
    return g.op("MatMul", weights, value)


def _kv_heads_like_query(g, query, key, value, rank_q: int, rank_k: int, enable_gqa: bool):
    """Grouped-query attention: K/V carry fewer heads than Q; repeat each K/V head (torch's
    enable_gqa semantics, repeat_interleave on dim -3). Decided from static head counts when
    known, otherwise from the enable_gqa flag with the ratio computed at run time."""
    symbolic_helper, _ = _helpers()
    if rank_q < 3 or rank_k < 3:
        return key, value
    h_q = (symbolic_helper._get_tensor_sizes(query) or [None] * rank_q)[-3]
    h_k = (symbolic_helper._get_tensor_sizes(key) or [None] * rank_k)[-3]
    if h_q is not None and h_k is not None:
        if h_q == h_k:
            return key, value
        if h_q % h_k:
            raise ValueError(f"scaled_dot_product_attention: {h_q} query heads are not a multiple of {h_k} key/value heads")
        n_rep = h_q // h_k
    elif enable_gqa:
        q_heads = _shape_slice(g, g.op("Shape", query), rank_q - 3, rank_q - 2)
        k_heads = _shape_slice(g, g.op("Shape", key), rank_k - 3, rank_k - 2)
        n_rep = g.op("Div", q_heads, k_heads)
    else:
        return key, value
    return _repeat_heads(g, key, n_rep, rank_k), _repeat_heads(g, value, n_rep, rank_k)


def _attention_scale(g, query, scale, q_type, rank_q: int):
    """The `scale` argument, else 1/sqrt(head_dim); applied to Q before Q @ K^T."""
    symbolic_helper, _ = _helpers()
    dtype, onnx_dtype = q_type.dtype(), q_type.onnx_type()
    scale = None if symbolic_helper._is_none(scale) else symbolic_helper._maybe_get_const(scale, "f")
    if isinstance(scale, float):
        return _const(g, scale, dtype)
    if scale is not None:  # a run-time value
        return g.op("Cast", scale, to_i=onnx_dtype)
    head_dim = (symbolic_helper._get_tensor_sizes(query) or [None] * rank_q)[-1]
    if head_dim is not None:
        return _const(g, 1.0 / math.sqrt(head_dim), dtype)
    e = _shape_slice(g, g.op("Shape", query), -1, _INT64_MAX)
    return g.op("Reciprocal", g.op("Sqrt", g.op("Cast", e, to_i=onnx_dtype)))


def _masked_scores(g, scores, mask, keep, q_type):
    """The scores with the masks applied, and what zeroes the softmax rows whose every key is
    masked. Boolean mask (and the causal ``keep``): True = attend. Float mask: added to the scores.
    Fully masked rows give 0 output and 0 gradient (torch's _safe_softmax), without NaN anywhere,
    so ORT's Softmax gradient stays finite."""
    _, _type_utils = _helpers()
    JST = _type_utils.JitScalarType
    dtype, onnx_dtype = q_type.dtype(), q_type.onnx_type()
    float_mask = mask is not None and _scalar_type(mask) != JST.BOOL
    if mask is not None and not float_mask:
        keep = mask if keep is None else g.op("And", mask, keep)
    if keep is not None and not float_mask:
        # Masked scores become the dtype's lowest finite value (not -inf): a fully masked row
        # then softmaxes to a uniform row, which the validity factor zeroes.
        lowest = _const(g, torch.finfo(dtype).min, dtype)
        if dtype in (torch.float32, torch.float64):
            # Added as a mask-shaped bias: the same values (lowest + a score rounds to lowest
            # in float32/64), but no scores-sized Where forward and backward (ORT's CPU Where
            # is slow; Add's gradient to the scores is the identity).
            scores = g.op("Add", scores, g.op("Where", keep, _const(g, 0.0, dtype), lowest))
        else:  # in half precision lowest + a negative score can overflow to -inf
            scores = g.op("Where", keep, scores, lowest)
        if mask is None:  # causal alone never masks a whole row
            return scores, lambda weights: weights
        row_any = _reduce_max_last(g, g.op("Cast", keep, to_i=onnx_dtype))
        return scores, lambda weights: g.op("Mul", weights, row_any)
    if mask is None:
        return scores, lambda weights: weights
    m_type = _scalar_type(mask)
    if m_type is not None and m_type != q_type:
        mask = g.op("Cast", mask, to_i=onnx_dtype)
    if keep is not None:  # float mask and is_causal (torch refuses this; combine anyway)
        # Add, not Where(keep, mask, -inf): ORT's Where gradient does not reduce broadcast
        # dimensions, and a float mask may need a gradient (T5's position bias).
        mask = g.op("Add", mask, g.op("Where", keep, _const(g, 0.0, dtype), _const(g, float("-inf"), dtype)))
    scores = g.op("Add", scores, mask)
    row_max = _reduce_max_last(g, mask)
    if dtype not in (torch.float32, torch.float64):  # IsInf is float/double only before opset 20
        row_max = g.op("Cast", row_max, to_i=JST.FLOAT.onnx_type())
    neg_inf_row = g.op("IsInf", row_max, detect_positive_i=0, detect_negative_i=1)
    scores = g.op("Where", neg_inf_row, _const(g, 0.0, dtype), scores)
    return scores, lambda weights: g.op("Where", neg_inf_row, _const(g, 0.0, dtype), weights)


def _attention_dropout(g, weights, dropout_p):
    """Dropout with training_mode=True and both outputs, which is what ORT's gradient needs.
    (SDPA applies dropout_p regardless of module.training, so training_mode is always on;
    transformers passes 0.0 in eval.)"""
    if isinstance(dropout_p, float) and dropout_p == 0.0:
        return weights
    _, _type_utils = _helpers()
    if isinstance(dropout_p, float):
        ratio = _const(g, dropout_p, torch.float)
    else:
        ratio = g.op("Cast", dropout_p, to_i=_type_utils.JitScalarType.FLOAT.onnx_type())
    weights, _mask = g.op("Dropout", weights, ratio, _const(g, True, torch.bool), outputs=2)
    return weights


# --------------------------------------------------------------------------------------
# aten::diff, aten::cumsum
# --------------------------------------------------------------------------------------


def _diff(g, self, n=1, dim=-1, prepend=None, append=None):
    symbolic_helper, _type_utils = _helpers()
    n = symbolic_helper._get_const(n, "i", "n")
    dim = symbolic_helper._get_const(dim, "i", "dim")
    x_type = _scalar_type(self)

    def _as_self_type(t):
        t_type = _scalar_type(t)
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
        later = _slice_axis(g, x, dim, 1, _INT64_MAX)
        earlier = _slice_axis(g, x, dim, 0, -1)
        # torch.diff on bool is logical_xor of neighbours
        x = g.op("Xor", later, earlier) if is_bool else g.op("Sub", later, earlier)
    return x


def _cumsum(g, self, dim, dtype=None):
    symbolic_helper, _type_utils = _helpers()
    JST = _type_utils.JitScalarType
    dim = symbolic_helper._get_const(dim, "i", "dim")
    if not symbolic_helper._is_none(dtype):
        target = JST(symbolic_helper._get_const(dtype, "i", "dtype"))
    else:
        src = _scalar_type(self)
        floating = {JST.FLOAT, JST.DOUBLE, JST.HALF, JST.BFLOAT16}
        # torch: integral and bool inputs accumulate (and return) int64
        target = src if src in floating else JST.INT64
    src = _scalar_type(self)
    x = self if src == target else g.op("Cast", self, to_i=target.onnx_type())
    return g.op("CumSum", x, _const(g, dim, torch.int64))


# --------------------------------------------------------------------------------------
# aten::where, aten::layer_norm
# --------------------------------------------------------------------------------------


def _maybe_broadcast(value, others) -> bool:
    """Whether ``value`` may be smaller than the broadcast of itself with ``others``.

    False only when the static types prove it: same rank as every other operand, and no dim
    that is 1 where another operand's dim is not known to be 1.
    """
    symbolic_helper, _ = _helpers()
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
    one = _const(g, 1, torch.int64)
    result = None
    for v, r in zip(values, ranks):
        shape = g.op("Shape", v)
        if r < rank:
            shape = g.op("Concat", _const(g, [1] * (rank - r), torch.int64), shape, axis_i=0)
        # broadcast(a, b) per dim = a where b == 1 else b (valid for broadcastable inputs, 0 included)
        result = shape if result is None else g.op("Where", g.op("Equal", shape, one), result, shape)
    return result


def _where(g, condition, self=None, other=None, _outputs=None):
    symbolic_helper, _ = _helpers()
    if symbolic_helper._is_none(self) or symbolic_helper._is_none(other):
        # torch.where(cond): the nonzero form; nothing to differentiate, torch's symbolic is fine.
        return _torch_symbolics(9).where(g, condition, self, other, _outputs)
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
        i for i in (1, 2)
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


def _layer_norm(g, input, normalized_shape, weight, bias, eps, cudnn_enable):
    symbolic_helper, _ = _helpers()
    # ORT's own layer_norm symbolic (re-registered by every ORTModule construction) passes a
    # missing weight or bias through as an empty input name. A missing scale is invalid ONNX;
    # a missing bias makes ORT's gradient builder name the bias gradient "_grad" for every
    # such LayerNorm ("Duplicate definition of name (_grad)": ModernBERT, any
    # nn.LayerNorm(bias=False)). Missing ones become constant ones / zeros instead.
    normalized_shape = symbolic_helper._get_const(normalized_shape, "is", "normalized_shape")
    eps = symbolic_helper._get_const(eps, "f", "eps")
    scalar_type = _scalar_type(input)
    dtype = scalar_type.dtype() if scalar_type is not None else torch.float32
    if symbolic_helper._is_none(weight):
        weight = g.op("Constant", value_t=torch.ones(normalized_shape, dtype=dtype))
    if symbolic_helper._is_none(bias):
        bias = g.op("Constant", value_t=torch.zeros(normalized_shape, dtype=dtype))
    # All three outputs, as ORT's version does: LayerNormalizationGrad reads mean and inv_std.
    out, _mean, _inv_std = g.op(
        "LayerNormalization", input, weight, bias, epsilon_f=eps, axis_i=-len(normalized_shape), outputs=3
    )
    return out


# --------------------------------------------------------------------------------------
# aten::gelu (training only)
# --------------------------------------------------------------------------------------

_BIAS_GELU_TYPES = ("Float", "Half", "BFloat16")


def _gelu(g, self, approximate="none"):
    symbolic_helper, _ = _helpers()
    approximate = approximate if isinstance(approximate, str) else symbolic_helper._maybe_get_const(approximate, "s")
    producer = self.node()
    scalar_type = _scalar_type(self)
    if (approximate == "none" and producer.kind() == "onnx::Add" and scalar_type is not None
            and scalar_type.scalar_name() in _BIAS_GELU_TYPES):
        a, b = list(producer.inputs())
        for x, bias in ((a, b), (b, a)):
            bias_sizes, x_sizes = symbolic_helper._get_tensor_sizes(bias), symbolic_helper._get_tensor_sizes(x)
            if (bias_sizes is not None and len(bias_sizes) == 1 and bias_sizes[0] is not None
                    and x_sizes is not None and len(x_sizes) >= 2 and x_sizes[-1] in (None, bias_sizes[0])
                    and _scalar_type(x) == scalar_type and _scalar_type(bias) == scalar_type):
                # The Add stays in the graph for any other consumer; unused, the exporter drops it.
                return g.op("com.microsoft::BiasGelu", x, bias).setType(self.type())
    return _torch_gelu(g.opset)(g, self, approximate)


def _logsumexp(g, self, dim, keepdim):
    symbolic_helper, _ = _helpers()
    dims = symbolic_helper._maybe_get_const(dim, "is")
    keep = bool(symbolic_helper._maybe_get_const(keepdim, "i"))
    if symbolic_helper._is_value(dims) or g.opset >= 18:
        return _torch_symbolics(g.opset).logsumexp(g, self, dim, keepdim)  # not the case ORT 1.19 trains
    dims = list(dims) if dims else list(range(symbolic_helper._get_tensor_rank(self)))
    out = g.op("ReduceLogSumExp", self, axes_i=dims, keepdims_i=1)
    return out if keep else g.op("Squeeze", out, _const(g, dims, torch.int64))


def _torch_gelu(opset: int):
    """torch's own gelu symbolic for ``opset`` (ONNX ``Gelu`` from opset 20, else the erf form)."""
    return _torch_symbolics(20 if opset >= 20 else 9).gelu


# --------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------

SYMBOLICS = {
    "aten::scaled_dot_product_attention": _sdpa,
    "aten::diff": _diff,
    "aten::cumsum": _cumsum,
    "aten::where": _where,
    "aten::layer_norm": _layer_norm,
}
# Entered into ORT's table only: ORTModule registers it for its own export's opset on
# construction, so plain torch.onnx exports (inference) keep torch's symbolic.
TRAINING_ONLY_SYMBOLICS = {
    "aten::gelu": _gelu,
    "aten::logsumexp": _logsumexp,
}


_ORT_REGISTRY = "onnxruntime.training.ortmodule._custom_op_symbolic_registry"
_ort_done = False


def _register_with_ort() -> bool:
    """Put the symbolics into ORT's own table, which ORTModule re-registers on construction.

    Without this, constructing an ORTModule would put ORT's ``layer_norm`` (and, with
    ``ORTMODULE_ATEN_SDPA_FALLBACK`` set, its SDPA) back over ours. Only done once ORTModule
    has been imported (importing it needs the compat bridges first).
    """
    module = sys.modules.get(_ORT_REGISTRY)
    if module is None:
        return False
    for name, fn in {**SYMBOLICS, **TRAINING_ONLY_SYMBOLICS}.items():
        domain, _, op = name.partition("::")
        module.CustomOpSymbolicRegistry.register(op, "" if domain == "aten" else domain, fn)
    return True


def register_training_symbolics(opset_version: int) -> None:
    """Register this module's symbolics for ``opset_version`` (idempotent; thread-safe).

    Call it after ``onnxruntime.training.ortmodule`` is imported and before the first
    ORTModule is built, so ORT's table carries them too. Affects every TorchScript ONNX export
    in the process at that opset, not only ORTModule's; the decompositions compute what torch
    computes, so plain exports stay correct.
    """
    global _ort_done
    opset_version = int(opset_version)
    with _LOCK:
        if opset_version not in _DONE:
            if opset_version < 14:
                raise ValueError(f"ort_hf's training symbolics need ONNX opset >= 14 (got {opset_version})")
            for name, fn in SYMBOLICS.items():
                torch.onnx.register_custom_op_symbolic(name, fn, opset_version)
            _DONE.add(opset_version)
        if not _ort_done:
            _ort_done = _register_with_ort()
