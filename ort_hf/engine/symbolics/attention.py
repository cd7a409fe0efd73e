"""``aten::scaled_dot_product_attention``: transformers' default attention (``attn_implementation="sdpa"``).

torch's opset-14 symbolic emits ``Dropout`` with one output and no ``training_mode`` input; ORT's
Dropout gradient needs the mask output, so building the gradient graph fails
(``gradient_builder_base.h ... i < node_->OutputDefs().size()``) as soon as attention dropout is
non-zero. It also rejects ``enable_gqa=True`` (transformers passes it for grouped-query attention
when there is no attention mask), turns fully masked rows of a boolean mask into 0 through
``Where(IsNaN)`` (the gradients come out NaN under ORT) and leaves fully ``-inf`` rows of a float
mask NaN (torch gives 0). The decomposition below is differentiable by ORT and matches torch's
math (rows where every key is masked give 0 output and 0 gradient, for boolean and for float
``-inf`` masks alike). In a CPU training export, where PyTorch's own flash-attention kernel applies,
that kernel runs instead (``flash_attention.py``).
"""

from __future__ import annotations

import math

import torch

from .flash_attention import flash_attention
from .graph_ops import (
    INT64_MAX,
    const,
    exporter_helpers,
    exporting_for_training,
    reduce_max_last,
    scalar_type,
    shape_slice,
)


def _repeat_heads(g, x, n_rep, rank):
    """``x.repeat_interleave(n_rep, dim=-3)`` for x of shape (..., H, S, E).

    ``n_rep`` is an int or a 1-element int64 tensor value. Batch and sequence sizes stay
    dynamic.
    """
    head_axis = rank - 3
    unsqueezed = g.op("Unsqueeze", x, const(g, [head_axis + 1], torch.int64))  # (..., H, 1, S, E)
    if isinstance(n_rep, int):
        expand_shape = const(g, [1] * (head_axis + 1) + [n_rep, 1, 1], torch.int64)
    else:
        parts = []
        if head_axis + 1:
            parts.append(const(g, [1] * (head_axis + 1), torch.int64))
        parts += [n_rep, const(g, [1, 1], torch.int64)]
        expand_shape = g.op("Concat", *parts, axis_i=0)
    expanded = g.op("Expand", unsqueezed, expand_shape)  # (..., H, n, S, E)
    shape = g.op("Shape", x)
    target = [const(g, [-1], torch.int64), shape_slice(g, shape, rank - 2, INT64_MAX)]
    if head_axis:
        target.insert(0, shape_slice(g, shape, 0, head_axis))
    return g.op("Reshape", expanded, g.op("Concat", *target, axis_i=0))


def _causal_keep(g, query, key, rank_q, rank_k):
    """Bool (L, S) mask, True where key position <= query position (top-left aligned, like torch)."""
    q_len = g.op("Gather", g.op("Shape", query), const(g, rank_q - 2, torch.int64), axis_i=0)
    k_len = g.op("Gather", g.op("Shape", key), const(g, rank_k - 2, torch.int64), axis_i=0)
    zero, one = const(g, 0, torch.int64), const(g, 1, torch.int64)
    rows = g.op("Unsqueeze", g.op("Range", zero, q_len, one), const(g, [1], torch.int64))
    cols = g.op("Unsqueeze", g.op("Range", zero, k_len, one), const(g, [0], torch.int64))
    return g.op("GreaterOrEqual", rows, cols)


def sdpa(g, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if exporting_for_training():  # PyTorch's CPU kernel where it applies (flash_attention.py)
        flash = flash_attention(g, query, key, value, attn_mask, dropout_p, is_causal, scale)
        if flash is not None:
            return flash
    symbolic_helper, _type_utils = exporter_helpers()
    JST = _type_utils.JitScalarType
    q_type = scalar_type(query, JST.FLOAT)
    is_causal = bool(symbolic_helper._maybe_get_const(is_causal, "b"))
    enable_gqa = (
        False if symbolic_helper._is_none(enable_gqa) else bool(symbolic_helper._maybe_get_const(enable_gqa, "b"))
    )
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
    symbolic_helper, _ = exporter_helpers()
    if rank_q < 3 or rank_k < 3:
        return key, value
    h_q = (symbolic_helper._get_tensor_sizes(query) or [None] * rank_q)[-3]
    h_k = (symbolic_helper._get_tensor_sizes(key) or [None] * rank_k)[-3]
    if h_q is not None and h_k is not None:
        if h_q == h_k:
            return key, value
        if h_q % h_k:
            raise ValueError(
                f"scaled_dot_product_attention: {h_q} query heads are not a multiple of {h_k} key/value heads"
            )
        n_rep = h_q // h_k
    elif enable_gqa:
        q_heads = shape_slice(g, g.op("Shape", query), rank_q - 3, rank_q - 2)
        k_heads = shape_slice(g, g.op("Shape", key), rank_k - 3, rank_k - 2)
        n_rep = g.op("Div", q_heads, k_heads)
    else:
        return key, value
    return _repeat_heads(g, key, n_rep, rank_k), _repeat_heads(g, value, n_rep, rank_k)


def _attention_scale(g, query, scale, q_type, rank_q: int):
    """The `scale` argument, else 1/sqrt(head_dim); applied to Q before Q @ K^T."""
    symbolic_helper, _ = exporter_helpers()
    dtype, onnx_dtype = q_type.dtype(), q_type.onnx_type()
    scale = None if symbolic_helper._is_none(scale) else symbolic_helper._maybe_get_const(scale, "f")
    if isinstance(scale, float):
        return const(g, scale, dtype)
    if scale is not None:  # a run-time value
        return g.op("Cast", scale, to_i=onnx_dtype)
    head_dim = (symbolic_helper._get_tensor_sizes(query) or [None] * rank_q)[-1]
    if head_dim is not None:
        return const(g, 1.0 / math.sqrt(head_dim), dtype)
    e = shape_slice(g, g.op("Shape", query), -1, INT64_MAX)
    return g.op("Reciprocal", g.op("Sqrt", g.op("Cast", e, to_i=onnx_dtype)))


def _masked_scores(g, scores, mask, keep, q_type):
    """The scores with the masks applied, and what zeroes the softmax rows whose every key is
    masked. Boolean mask (and the causal ``keep``): True = attend. Float mask: added to the scores.
    Fully masked rows give 0 output and 0 gradient (torch's _safe_softmax), without NaN anywhere,
    so ORT's Softmax gradient stays finite."""
    _, _type_utils = exporter_helpers()
    JST = _type_utils.JitScalarType
    dtype, onnx_dtype = q_type.dtype(), q_type.onnx_type()
    float_mask = mask is not None and scalar_type(mask) != JST.BOOL
    if mask is not None and not float_mask:
        keep = mask if keep is None else g.op("And", mask, keep)
    if keep is not None and not float_mask:
        # Masked scores become the dtype's lowest finite value (not -inf): a fully masked row
        # then softmaxes to a uniform row, which the validity factor zeroes.
        lowest = const(g, torch.finfo(dtype).min, dtype)
        if dtype in (torch.float32, torch.float64):
            # Added as a mask-shaped bias: the same values (lowest + a score rounds to lowest
            # in float32/64), but no scores-sized Where forward and backward (ORT's CPU Where
            # is slow; Add's gradient to the scores is the identity).
            scores = g.op("Add", scores, g.op("Where", keep, const(g, 0.0, dtype), lowest))
        else:  # in half precision lowest + a negative score can overflow to -inf
            scores = g.op("Where", keep, scores, lowest)
        if mask is None:  # causal alone never masks a whole row
            return scores, lambda weights: weights
        row_any = reduce_max_last(g, g.op("Cast", keep, to_i=onnx_dtype))
        return scores, lambda weights: g.op("Mul", weights, row_any)
    if mask is None:
        return scores, lambda weights: weights
    m_type = scalar_type(mask)
    if m_type is not None and m_type != q_type:
        mask = g.op("Cast", mask, to_i=onnx_dtype)
    if keep is not None:  # float mask and is_causal (torch refuses this; combine anyway)
        # Add, not Where(keep, mask, -inf): ORT's Where gradient does not reduce broadcast
        # dimensions, and a float mask may need a gradient (T5's position bias).
        mask = g.op("Add", mask, g.op("Where", keep, const(g, 0.0, dtype), const(g, float("-inf"), dtype)))
    scores = g.op("Add", scores, mask)
    row_max = reduce_max_last(g, mask)
    if dtype not in (torch.float32, torch.float64):  # IsInf is float/double only before opset 20
        row_max = g.op("Cast", row_max, to_i=JST.FLOAT.onnx_type())
    neg_inf_row = g.op("IsInf", row_max, detect_positive_i=0, detect_negative_i=1)
    scores = g.op("Where", neg_inf_row, const(g, 0.0, dtype), scores)
    return scores, lambda weights: g.op("Where", neg_inf_row, const(g, 0.0, dtype), weights)


def _attention_dropout(g, weights, dropout_p):
    """Dropout with training_mode=True and both outputs, which is what ORT's gradient needs.
    (SDPA applies dropout_p regardless of module.training, so training_mode is always on;
    transformers passes 0.0 in eval.)"""
    if isinstance(dropout_p, float) and dropout_p == 0.0:
        return weights
    _, _type_utils = exporter_helpers()
    if isinstance(dropout_p, float):
        ratio = const(g, dropout_p, torch.float)
    else:
        ratio = g.op("Cast", dropout_p, to_i=_type_utils.JitScalarType.FLOAT.onnx_type())
    weights, _mask = g.op("Dropout", weights, ratio, const(g, True, torch.bool), outputs=2)
    return weights
