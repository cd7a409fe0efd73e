"""``aten::gelu`` (training exports only): exact GELU after a linear layer as ORT's ``BiasGelu``.

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
"""

from __future__ import annotations

from .graph_ops import exporter_helpers, scalar_type, torch_symbolics

_BIAS_GELU_TYPES = ("Float", "Half", "BFloat16")


def gelu(g, self, approximate="none"):
    symbolic_helper, _ = exporter_helpers()
    approximate = approximate if isinstance(approximate, str) else symbolic_helper._maybe_get_const(approximate, "s")
    producer = self.node()
    self_type = scalar_type(self)
    if (
        approximate == "none"
        and producer.kind() == "onnx::Add"
        and self_type is not None
        and self_type.scalar_name() in _BIAS_GELU_TYPES
    ):
        a, b = list(producer.inputs())
        for x, bias in ((a, b), (b, a)):
            bias_sizes, x_sizes = symbolic_helper._get_tensor_sizes(bias), symbolic_helper._get_tensor_sizes(x)
            if (
                bias_sizes is not None
                and len(bias_sizes) == 1
                and bias_sizes[0] is not None
                and x_sizes is not None
                and len(x_sizes) >= 2
                and x_sizes[-1] in (None, bias_sizes[0])
                and scalar_type(x) == self_type
                and scalar_type(bias) == self_type
            ):
                # The Add stays in the graph for any other consumer; unused, the exporter drops it.
                return g.op("com.microsoft::BiasGelu", x, bias).setType(self.type())
    return _torch_gelu(g.opset)(g, self, approximate)


def _torch_gelu(opset: int):
    """torch's own gelu symbolic for ``opset`` (ONNX ``Gelu`` from opset 20, else the erf form)."""
    return torch_symbolics(20 if opset >= 20 else 9).gelu
