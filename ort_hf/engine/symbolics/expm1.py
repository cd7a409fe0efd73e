"""``aten::expm1`` as an ORT ``ATen`` node (torch's own kernel inside the graph), with its gradient.

transformers' xIELU activation (Apertus) computes ``expm1(min(x, eps))`` on its negative side, and
torch's TorchScript exporter has no ``expm1`` symbolic at any opset (ONNX has no such op). ``Exp(x) - 1``
would lose the relative precision ``expm1`` exists for (near 0, where xIELU's ``eps`` sits), so the
node calls torch's ``expm1``: forward values as PyTorch's, bit for bit.

The gradient (registered in ORT's gradient table, below) is torch's own formula
(``derivatives.yaml``: ``grad * (result + 1)``), computed from the node's output in the same order,
so it matches PyTorch's to the bit as well.

Training exports only (an ``ATen`` node needs ORT). It can go when torch's TorchScript exporter gains
an ``expm1`` symbolic (none up to torch 2.13).
"""

from __future__ import annotations

_ATEN = "org.pytorch.aten"
_OP = "expm1"


def expm1(g, self):
    out = g.op(f"{_ATEN}::ATen", self, operator_s=_OP)
    out.setType(self.type())  # ORT infers no type for an ATen node's output
    return out


def expm1_gradient():
    """ORT gradient definition of the node above (``_custom_gradient_registry``'s format)."""
    return [
        ("Constant", [], ["One"], {"value": {"value": 1.0, "dtype": "IElemType(0)", "is_tensor": True}}),
        ("Add", ["O(0)", "One"], ["Result_plus_one"]),
        ("Mul", ["GO(0)", "Result_plus_one"], ["GI(0)"]),
    ]


GRADIENTS = {(_ATEN, "ATen", _OP, ""): expm1_gradient}
