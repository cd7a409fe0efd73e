"""``aten::scatter_reduce`` with ``include_self=False`` (TAPAS' segment sums, means, maxima and minima).

torch's symbolic refuses ``include_self=False`` ("ONNX does not support include_self=False") and the
``"mean"`` reduction. TAPAS reduces every segment with ``zeros(n).scatter_reduce(0, index, values,
reduce, include_self=False)``: ``"sum"`` and ``"mean"`` of token logits (they need a gradient),
``"amin"`` of position ids and ``"amax"`` of labels (they need none). Here:

- ``"sum"`` and ``"mean"``: the values are scattered with ``ScatterElements(reduction="add")`` into
  zeros, and a count of the writes per position the same way; touched positions take the sum (or
  sum / count), untouched ones keep ``self`` (a ``Where``). ORT's ``ScatterElements`` gradient
  ignores the reduction, but for the updates of an ``add`` it is right (``GatherElements`` of the
  output gradient), and the zeros it scatters into need none; ``self`` gets the gradient where no
  index wrote, as in torch.
- ``"amax"`` and ``"amin"``, for tensors that cannot need a gradient (integer, or traced as not
  requiring one): ``ScatterElements(reduction="max"/"min")`` from opset 18; below it, each index's
  extreme picked by sorting (:func:`_extreme_by_sorting`) and written with a plain
  ``ScatterElements``. In a training export where a gradient could be asked they are refused (ORT's
  gradient would ignore the reduction).

Anything else (``"prod"``, ``"mean"`` on integers, ``include_self=True``) keeps torch's symbolic.
It can go when torch's exporter handles ``include_self=False`` (not as of torch 2.13).
"""

from __future__ import annotations

import torch

from .graph_ops import (
    INT64_MAX,
    const,
    exporter_helpers,
    exporting_for_training,
    scalar_type,
    slice_axis,
    torch_symbolics,
)

_EXTREMES = {"amax": "max", "amin": "min"}


def _fill(g, like, value, dtype):
    return g.op("ConstantOfShape", g.op("Shape", like), value_t=torch.tensor([value], dtype=dtype))


def _src_as_index(g, src, index, symbolic_helper):
    """``src`` cut to ``index``'s shape (torch reads only that much of it; ONNX wants equal shapes)."""
    src_sizes, index_sizes = symbolic_helper._get_tensor_sizes(src), symbolic_helper._get_tensor_sizes(index)
    if src_sizes is not None and src_sizes == index_sizes and None not in src_sizes:
        return src
    rank = symbolic_helper._get_tensor_rank(index)
    return g.op(
        "Slice", src, const(g, [0] * rank, torch.int64), g.op("Shape", index), const(g, list(range(rank)), torch.int64)
    )


def _sum_and_count(g, self, axis, index, src, dtype):
    total = g.op("ScatterElements", _fill(g, self, 0, dtype), index, src, axis_i=axis, reduction_s="add")
    count = g.op(
        "ScatterElements", _fill(g, self, 0, dtype), index, _fill(g, index, 1, dtype), axis_i=axis, reduction_s="add"
    )
    return total, count


def _extreme(g, self, axis, index, src, mode, dtype):
    if g.opset >= 18:
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        identity = info.min if mode == "amax" else info.max
        if dtype.is_floating_point:
            identity = float("-inf") if mode == "amax" else float("inf")
        out = g.op(
            "ScatterElements", _fill(g, self, identity, dtype), index, src, axis_i=axis, reduction_s=_EXTREMES[mode]
        )
        _, count = _sum_and_count(g, self, axis, index, src, dtype)
        return g.op("Where", g.op("Greater", count, const(g, 0, dtype)), out, self)
    return _extreme_by_sorting(g, self, axis, index, src, mode)


def _extreme_by_sorting(g, self, axis, index, src, mode):
    """Below opset 18 (no ``max`` / ``min`` reduction): the updates sorted by value (ascending for
    ``amax``), then stably by index (ONNX ``TopK`` puts equal keys in input order), so the last of each
    index's run holds its extreme. Only those are written to their index; the others go to a scratch
    slot past the end, dropped after: no position is written twice (ONNX leaves the order of
    duplicate writes undefined)."""
    length = g.op("Gather", g.op("Shape", src), const(g, [axis], torch.int64), axis_i=0)
    by_value, order = g.op("TopK", src, length, axis_i=axis, largest_i=int(mode == "amin"), sorted_i=1, outputs=2)
    index = g.op("GatherElements", index, order, axis_i=axis)
    index, order = g.op("TopK", index, length, axis_i=axis, largest_i=0, sorted_i=1, outputs=2)
    by_value = g.op("GatherElements", by_value, order, axis_i=axis)
    first = slice_axis(g, index, axis, 0, 1)
    following = g.op(
        "Concat",
        slice_axis(g, index, axis, 1, INT64_MAX),
        g.op("Sub", g.op("Mul", first, const(g, 0, torch.int64)), const(g, 1, torch.int64)),
        axis_i=axis,
    )
    size = g.op("Gather", g.op("Shape", self), const(g, [axis], torch.int64), axis_i=0)
    target = g.op("Where", g.op("Equal", index, following), size, index)  # not the last: to the scratch slot
    padded = g.op("Concat", self, slice_axis(g, self, axis, 0, 1), axis_i=axis)
    return slice_axis(g, g.op("ScatterElements", padded, target, by_value, axis_i=axis), axis, 0, -1)


def _may_need_gradient(value) -> bool:
    """Whether ``value`` is reached from a graph input (an input or a parameter) through floating-point
    values only: a path a gradient could flow back along. (ORTModule exports under ``no_grad``, so the
    traced types' ``requires_grad`` says nothing.) Integer and bool values cut the path."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        st = scalar_type(v)
        if st is not None and not (st.dtype().is_floating_point or st.dtype().is_complex):
            continue
        node = v.node()
        if node.kind() == "prim::Param":
            return True
        stack.extend(node.inputs())
    return False


def scatter_reduce(g, self, dim, index, src, reduce, include_self):  # noqa: A002  (torch's argument names)
    symbolic_helper, _ = exporter_helpers()
    mode = symbolic_helper._maybe_get_const(reduce, "s")
    keep_self = symbolic_helper._maybe_get_const(include_self, "b")
    st = scalar_type(self)
    dtype = None if st is None else st.dtype()
    handled = (
        keep_self is False
        and dtype is not None
        and symbolic_helper._is_value(index)
        and (mode in ("sum", *_EXTREMES) or (mode == "mean" and dtype.is_floating_point))
    )
    if not handled:
        return torch_symbolics(16).scatter_reduce(g, self, dim, index, src, reduce, include_self)
    axis = symbolic_helper._get_const(dim, "i", "dim")
    rank = symbolic_helper._get_tensor_rank(self)
    if axis < 0 and rank is not None:
        axis += rank
    if mode in _EXTREMES and exporting_for_training() and (_may_need_gradient(self) or _may_need_gradient(src)):
        symbolic_helper._onnx_unsupported(
            f"aten::scatter_reduce with reduce={mode!r}, include_self=False on a tensor that may need a gradient "
            "(ORT's ScatterElements gradient would ignore the reduction)",
            self,
        )
    src = _src_as_index(g, src, index, symbolic_helper)
    if scalar_type(src) != st:
        src = g.op("Cast", src, to_i=st.onnx_type())
    if mode in _EXTREMES:
        out = _extreme(g, self, axis, index, src, mode, dtype)
    else:
        total, count = _sum_and_count(g, self, axis, index, src, dtype)
        touched = g.op("Greater", count, const(g, 0, dtype))
        if mode == "mean":
            total = g.op("Div", total, g.op("Max", count, const(g, 1, dtype)))
        out = g.op("Where", touched, total, self)
    out.setType(self.type())
    return out
