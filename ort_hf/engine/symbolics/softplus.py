"""``aten::softplus``, and a gradient for ONNX ``Softplus``, which ORT 1.19.2 lacks ("gradient builder
has not been registered: Softplus": Doge's attention, Jamba's Mamba ``dt``, any ``F.softplus``).

The gradient (registered in ORT's gradient table, below) is ``dX = dY * Sigmoid(X)``, the derivative
of ``log(1 + exp(x))``.

torch's own symbolic exports ``softplus(x, beta, threshold)`` as ``Softplus(beta * x) / beta`` and
drops ``threshold``, past which torch returns ``x`` itself (and passes the gradient through
unchanged). This one keeps it: ``Where(beta * x > threshold, x, Softplus(beta * x) / beta)``, as
torch computes it. The Where's gradient then passes ``dY`` through where torch does, and
``dY * Sigmoid(beta * x)`` elsewhere (torch: ``dY * z / (z + 1)``, ``z = exp(beta * x)``: one
rounding apart).

It can go when ORT has a Softplus gradient (none up to 1.19.2, the last release of ORT training).
"""

from __future__ import annotations

from .graph_ops import const, exporter_helpers, scalar_type


def softplus(g, self, beta, threshold):
    symbolic_helper, _type_utils = exporter_helpers()
    beta = symbolic_helper._get_const(beta, "f", "beta")
    threshold = symbolic_helper._get_const(threshold, "f", "threshold")
    dtype = scalar_type(self, _type_utils.JitScalarType.FLOAT).dtype()
    scaled = self if beta == 1 else g.op("Mul", self, const(g, beta, dtype))
    out = g.op("Softplus", scaled)
    if beta != 1:
        out = g.op("Div", out, const(g, beta, dtype))
    return g.op("Where", g.op("Greater", scaled, const(g, threshold, dtype)), self, out)


def softplus_gradient():
    """ORT gradient definition of ONNX ``Softplus`` (``_custom_gradient_registry``'s format)."""
    return [
        ("Sigmoid", ["I(0)"], ["Sigmoid_X"]),
        ("Mul", ["GO(0)", "Sigmoid_X"], ["GI(0)"]),
    ]


GRADIENTS = {("", "Softplus"): softplus_gradient}
