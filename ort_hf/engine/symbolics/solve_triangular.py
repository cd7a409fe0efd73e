"""``aten::linalg_solve_triangular`` as an ORT ``ATen`` node (PyTorch's own kernel inside the graph),
with its gradient.

The gated delta-net layers (Qwen3-Next, Qwen3.5, OLMo-Hybrid, LaRA-mini; transformers'
``torch_chunk_gated_delta_rule``) solve each chunk's unit lower triangular system with
``torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True)``, on the full matrix ``A``
(the solver reads only the strict lower triangle). torch has no ONNX symbolic for it, and ONNX no
triangular solve; so the node calls torch's kernel.

The node is always a left solve (``A X = B``): a right solve ``X A = B`` is exported as
``(A^T X^T = B^T)^T`` with ``upper`` flipped, and ``A`` and ``B`` are ``Expand``-ed to their common
batch shape first (ORT's ``Expand`` gradient sums the gradient back over broadcast dimensions), so
the one gradient below serves every call. It is torch's own formula
(``linalg_solve_triangular_backward``), in the same order of operations:
``dB = solve_triangular(A^T, dX, upper=not upper, unitriangular)`` and
``dA = -(dB @ X^T)``, kept to the triangle the solver reads (``triu(unitriangular)`` if ``upper``,
else ``tril(-unitriangular)``). ``upper`` and ``unitriangular`` are the node's own (bool)
inputs, read at run time, since ORT's gradient table is keyed by operator only.

It can go when torch's TorchScript exporter or ORT learns ``linalg_solve_triangular``: neither has
as of torch 2.13 / ORT 1.19.2.
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers, shape_slice

_ATEN = "org.pytorch.aten"
_OP = "linalg_solve_triangular"


def _transpose_last(g, x, rank):
    return g.op("Transpose", x, perm_i=[*range(rank - 2), rank - 1, rank - 2])


def _broadcast_batch(g, x, other, x_sizes, other_sizes):
    """``x`` expanded to the batch dimensions it shares with ``other`` (the last two kept)."""
    if x_sizes is not None and other_sizes is not None and None not in x_sizes and None not in other_sizes:
        if torch.broadcast_shapes(tuple(x_sizes[:-2]), tuple(other_sizes[:-2])) == tuple(x_sizes[:-2]):
            return x  # already the common batch shape
    batch = shape_slice(g, g.op("Shape", other), 0, -2)
    shape = g.op("Concat", batch, const(g, [1, 1], torch.int64), axis_i=0)
    return g.op("Expand", x, shape)  # ONNX Expand broadcasts both ways, right-aligned: torch's rule


def linalg_solve_triangular(g, self, B, upper, left, unitriangular):
    symbolic_helper, _ = exporter_helpers()
    upper = bool(symbolic_helper._get_const(upper, "b", "upper"))
    left = bool(symbolic_helper._get_const(left, "b", "left"))
    unitriangular = bool(symbolic_helper._get_const(unitriangular, "b", "unitriangular"))
    rank_a, rank_b = symbolic_helper._get_tensor_rank(self), symbolic_helper._get_tensor_rank(B)
    if rank_a is None or rank_b is None:
        symbolic_helper._onnx_unsupported("aten::linalg_solve_triangular with inputs of unknown rank", self)
    sizes_a, sizes_b = symbolic_helper._get_tensor_sizes(self), symbolic_helper._get_tensor_sizes(B)
    out_type = B.type()
    if not left:  # X A = B  <=>  A^T X^T = B^T
        self, B = _transpose_last(g, self, rank_a), _transpose_last(g, B, rank_b)
        sizes_a = None if sizes_a is None else [*sizes_a[:-2], sizes_a[-1], sizes_a[-2]]
        sizes_b = None if sizes_b is None else [*sizes_b[:-2], sizes_b[-1], sizes_b[-2]]
        upper = not upper
    self, B = _broadcast_batch(g, self, B, sizes_a, sizes_b), _broadcast_batch(g, B, self, sizes_b, sizes_a)
    # the triangle the solver reads (what it returns is unchanged); its gradient masks dA to it
    self = g.op("Trilu", self, const(g, (1 if upper else -1) * int(unitriangular), torch.int64), upper_i=int(upper))
    flags = [g.op("Constant", value_t=torch.tensor(flag)) for flag in (upper, True, unitriangular)]
    out = g.op(f"{_ATEN}::ATen", self, B, *flags, operator_s=_OP)
    rank = max(rank_a, rank_b)
    out.setType(out_type.with_sizes([None] * rank))  # ORT infers no type for an ATen node's output
    return out if left else _transpose_last(g, out, rank)


def _node(op_type, inputs, outputs, **attributes):
    kinds = {int: "int", str: "string"}
    return (op_type, inputs, outputs, {k: {"value": v, "dtype": kinds[type(v)]} for k, v in attributes.items()})


def solve_triangular_gradient():
    """ORT gradient definition of the node above (``_custom_gradient_registry``'s format).

    Inputs: ``I(0)`` = A (masked to its triangle), ``I(1)`` = B, ``I(2)`` = upper, ``I(3)`` = left
    (always true), ``I(4)`` = unitriangular; ``O(0)`` = X."""
    transpose = "...ij->...ji"  # any rank: the gradient table cannot know it
    solve = {"operator": {"value": _OP, "dtype": "string"}}
    return [
        _node("Einsum", ["I(0)"], ["A_t"], equation=transpose),
        _node("Not", ["I(2)"], ["Flipped"]),
        # dB = solve_triangular(A^T, dX, upper=not upper, left=True, unitriangular)
        (("ATen", _ATEN), ["A_t", "GO(0)", "Flipped", "I(3)", "I(4)"], ["GI(1)"], solve),
        # dA = -(dB @ X^T) = solve_triangular(A^T, -(dX @ X^T), ...), left to the forward's mask
        _node("Einsum", ["O(0)"], ["X_t"], equation=transpose),
        _node("MatMul", ["GO(0)", "X_t"], ["dX_Xt"]),
        _node("Neg", ["dX_Xt"], ["Minus_dX_Xt"]),
        (("ATen", _ATEN), ["A_t", "Minus_dX_Xt", "Flipped", "I(3)", "I(4)"], ["GI(0)"], solve),
    ]


GRADIENTS = {(_ATEN, "ATen", _OP, ""): solve_triangular_gradient}
