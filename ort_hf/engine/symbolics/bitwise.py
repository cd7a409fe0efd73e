"""``aten::bitwise_and`` / ``bitwise_or`` / ``bitwise_xor`` (and the ``&``, ``|``, ``^`` operators,
``aten::__and_`` ...) for any dtype torch takes, at every opset.

torch's TorchScript exporter has no ``bitwise_and`` symbolic below opset 18 (T5Gemma2's sliding-window
mask), and its ``|`` and ``&`` refuse non-boolean inputs (CPM-Ant's attention mask ORs an int32
``context`` with a boolean mask). ORTModule exports at opset 16 by default (``ORTOptions.opset_version``).

The result dtype is torch's (``torch.result_type``, with its rule that a 0-dim operand does not
promote a tensor of the same kind). Then:

- boolean: ONNX ``And`` / ``Or`` / ``Xor``, as torch's own symbolic;
- integer, opset >= 18: ONNX ``BitwiseAnd`` / ``BitwiseOr`` / ``BitwiseXor``;
- integer, below opset 18: an ORT ``ATen`` node calling torch's own op (no ONNX op of those opsets
  computes bits of integers exactly).

No gradient: torch defines none (integer and boolean outputs). Training exports only (the ``ATen``
node needs ORT). It can go when ORTModule exports at opset 18 and torch's ``|`` symbolic takes
integers (it does not, up to torch 2.13).
"""

from __future__ import annotations

import torch

from .graph_ops import exporter_helpers, scalar_type

_ATEN = "org.pytorch.aten"
_BOOLEAN = {"and": "And", "or": "Or", "xor": "Xor"}
_INTEGER = {"and": "BitwiseAnd", "or": "BitwiseOr", "xor": "BitwiseXor"}


def _result_dtype(symbolic_helper, self, other):
    """torch's result dtype of the operation."""
    ranks = [symbolic_helper._get_tensor_rank(v) for v in (self, other)]
    types = [scalar_type(v) for v in (self, other)]
    if None in types:
        symbolic_helper._onnx_unsupported("a bitwise op on an operand of unknown dtype", self)
    # Rank 0 vs not matters to the promotion (an unknown rank is taken as a tensor's); sizes do not.
    probes = [torch.empty([1] * (1 if r is None else r), dtype=t.dtype()) for r, t in zip(ranks, types)]
    return torch.result_type(*probes)


def _bitwise(kind: str):
    def symbolic(g, self, other):
        symbolic_helper, _type_utils = exporter_helpers()
        dtype = _result_dtype(symbolic_helper, self, other)
        if dtype == torch.bool:
            return g.op(_BOOLEAN[kind], self, other)
        if dtype.is_floating_point or dtype.is_complex:
            symbolic_helper._onnx_unsupported(f"aten::bitwise_{kind} on {dtype}", self)
        onnx_type = _type_utils.JitScalarType.from_dtype(dtype).onnx_type()
        self, other = g.op("Cast", self, to_i=onnx_type), g.op("Cast", other, to_i=onnx_type)
        if g.opset >= 18:
            return g.op(_INTEGER[kind], self, other)
        # ``__or__``, not ``bitwise_or``: ORT's symbolic shape inference has a rule for an ATen
        # ``bitwise_or``, which loses the broadcast dims of operands whose dims are named apart
        # ("Incomplete symbolic shape inference"); for the others it reads the type given here, the
        # broadcast type of an elementwise ONNX op (left unused: the export's dead-code pass drops it).
        out = g.op(f"{_ATEN}::ATen", self, other, operator_s=f"__{kind}__", overload_name_s="Tensor")
        out.setType(g.op("Equal", self, other).type().with_dtype(dtype))
        return out

    symbolic.__name__ = f"bitwise_{kind}"
    return symbolic


bitwise_and, bitwise_or, bitwise_xor = _bitwise("and"), _bitwise("or"), _bitwise("xor")

SYMBOLICS = {
    "aten::bitwise_and": bitwise_and,
    "aten::__and_": bitwise_and,
    "aten::bitwise_or": bitwise_or,
    "aten::__or_": bitwise_or,
    "aten::bitwise_xor": bitwise_xor,
    "aten::__xor_": bitwise_xor,
}
