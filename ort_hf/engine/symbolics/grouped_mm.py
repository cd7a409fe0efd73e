"""``aten::_grouped_mm`` as an ORT ``ATen`` node (PyTorch's own kernel inside the graph), with
its gradient.

transformers' default experts implementation (``integrations/moe.py``, ``grouped_mm``) runs each
expert's projections as one ``torch.nn.functional.grouped_mm(tokens [S, K], weights [E, K, N],
offs)`` over the tokens sorted by expert (``offs``: the cumulative counts ``histc`` gives). torch
has no ONNX symbolic for it; there is no ONNX op that multiplies each group of rows by its own
matrix without first copying a weight per row (``S x K x N``) or computing every expert for every
row (``E x``). So the node calls torch's ``_grouped_mm`` (its CPU kernel is a loop of ``mm`` over
the groups), and the gradient (registered in ORT's table, below) calls it twice more, as
torch's autograd does: ``dX = grouped_mm(dY, W^T, offs)`` and ``dW = grouped_mm(X^T, dY, offs)``
(the 2-D x 2-D form, grouped along ``S``, gives ``[E, K, N]``).

torch's kernel asks every non-unit stride to be a multiple of 16 bytes. Its autograd passes
``X^T`` as a view (stride ``K``, aligned since the forward ran); ORT hands the ATen node a
contiguous ``Transpose``, whose stride is ``S``, the token count: ``X`` and ``dY`` are padded
with zero rows to a multiple of 16 first. Rows past ``offs[-1]`` are in no group, so the padding
adds nothing.

Only ``bias=None`` and no ``out_dtype`` (what transformers passes). It can go when torch's
TorchScript exporter or ORT learns ``_grouped_mm``: neither has as of torch 2.13 / ORT 1.19.2.
"""

from __future__ import annotations

from .graph_ops import exporter_helpers

_ATEN = "org.pytorch.aten"
_OP = "_grouped_mm"


def grouped_mm(g, self, mat2, offs=None, bias=None, out_dtype=None):
    symbolic_helper, _ = exporter_helpers()
    if symbolic_helper._is_none(offs) or not symbolic_helper._is_none(bias) or not symbolic_helper._is_none(out_dtype):
        symbolic_helper._onnx_unsupported("aten::_grouped_mm without offs, or with a bias or out_dtype", self)
    if symbolic_helper._get_tensor_rank(self) != 2 or symbolic_helper._get_tensor_rank(mat2) != 3:
        symbolic_helper._onnx_unsupported("aten::_grouped_mm other than [S, K] x [E, K, N]", self)
    out = g.op(f"{_ATEN}::ATen", self, mat2, offs, bias, out_dtype, operator_s=_OP)
    rows = symbolic_helper._get_tensor_dim_size(self, 0)
    cols = symbolic_helper._get_tensor_dim_size(mat2, 2)
    out.setType(self.type().with_sizes([rows, cols]))  # ORT infers no type for an ATen node's output
    return out


def _int64(name: str, value: list[int]):
    return ("Constant", [], [name], {"value": {"value": value, "dtype": "int", "is_tensor": True}})


def _aten(inputs: list[str], output: str):
    return ((("ATen", _ATEN)), inputs, [output], {"operator": {"value": _OP, "dtype": "string"}})


def grouped_mm_gradient():
    """ORT gradient definition of the node above (``_custom_gradient_registry``'s format)."""
    return [
        # dX = grouped_mm(dY [S, N], W^T [E, N, K], offs)
        ("Transpose", ["I(1)"], ["W_t"], {"perm": {"value": [0, 2, 1], "dtype": "int"}}),
        _aten(["GO(0)", "W_t", "I(2)", "", ""], "GI(0)"),
        # dW = grouped_mm(X^T [K, S'], dY [S', N], offs), S' = S rounded up to a multiple of 16
        ("Shape", ["I(0)"], ["X_shape"]),
        _int64("Zero_1", [0]),
        _int64("One_1", [1]),
        _int64("Sixteen_1", [16]),
        ("Slice", ["X_shape", "Zero_1", "One_1"], ["Rows"]),
        ("Mod", ["Rows", "Sixteen_1"], ["Rows_mod"]),
        ("Sub", ["Sixteen_1", "Rows_mod"], ["Short"]),
        ("Mod", ["Short", "Sixteen_1"], ["Extra_rows"]),
        _int64("Zero_2", [0, 0]),
        ("Concat", ["Zero_2", "Extra_rows", "Zero_1"], ["Pads"], {"axis": {"value": 0, "dtype": "int"}}),
        ("Pad", ["I(0)", "Pads"], ["X_padded"]),
        ("Pad", ["GO(0)", "Pads"], ["dY_padded"]),
        ("Transpose", ["X_padded"], ["X_t"], {"perm": {"value": [1, 0], "dtype": "int"}}),
        _aten(["X_t", "dY_padded", "I(2)", "", ""], "GI(1)"),
    ]


GRADIENTS = {(_ATEN, "ATen", _OP, ""): grouped_mm_gradient}
