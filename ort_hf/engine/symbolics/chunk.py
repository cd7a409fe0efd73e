"""``prim::ConstantChunk`` (``Tensor.chunk``) as an ONNX ``Split`` whose output shapes ONNX can infer.

ORTModule 1.19.2 registers its own symbolic for it (one ``Split`` instead of torch's ``Slice`` per
chunk, for a single ``SplitGrad`` in backward) and computes the split sizes at run time from
``Shape``, even when the chunked axis has a fixed size (a projection's width). ONNX cannot infer
the shape of a ``Split`` with computed sizes, and then torch's exporter types its outputs with the
shapes it traced on the first batch, batch and sequence included; a later ``x.size()`` on anything
computed from them is exported as those numbers. DeBERTa (v1) chunks its fused QKV projection and
reshapes the attention context with ``context_layer.size()[:-2] + (-1,)``
(``modeling_deberta.py:273``): the graph held the first batch's batch size and length, and the
next batch of another length failed in ORT (``Reshape``: 56x96 cannot be 4x12x96).

Here a chunked axis of known size is split by constant sizes (torch's rule: ``ceil(n / chunks)``
each, the rest last), so ONNX infers every output's shape, dynamic axes kept. An axis of unknown
size (chunking the sequence) keeps ORT's run-time sizes: there ONNX gives the outputs that axis
unknown and the others from the input, which is right (``tests/engine/test_length_check.py``).
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers


def constant_chunk(g, self, chunks, dim):
    symbolic_helper, _ = exporter_helpers()
    outputs = g.original_node.outputsSize() if hasattr(g, "original_node") else chunks
    if outputs == 1:
        return self
    rank = symbolic_helper._get_tensor_rank(self)
    axis = dim + rank if (dim < 0 and rank is not None) else dim
    size = symbolic_helper._get_tensor_dim_size(self, axis) if axis >= 0 else None
    if size is not None:
        step = -(-size // chunks)
        sizes = [min(step, size - i * step) for i in range(outputs)]
        return g.op("Split", self, const(g, sizes, torch.int64), axis_i=dim, outputs=outputs)
    # The chunked axis's size is only known at run time: ORT's sizes, computed from Shape.
    length = g.op("Gather", g.op("Shape", self), const(g, [dim], torch.int64), axis_i=0)
    step = g.op("Div", g.op("Add", length, const(g, [chunks - 1], torch.int64)), const(g, [chunks], torch.int64))
    rest = g.op("Sub", length, g.op("Mul", step, const(g, [outputs - 1], torch.int64)))
    sizes = g.op("Concat", g.op("Expand", step, const(g, [outputs - 1], torch.int64)), rest, axis_i=0)
    return g.op("Split", self, sizes, axis_i=dim, outputs=outputs)
