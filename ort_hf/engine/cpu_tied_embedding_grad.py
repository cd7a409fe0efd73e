"""A tied embedding table's gradient, summed into the head's weight gradient in place.

A table tied to the output head (BERT's MLM decoder, GPT-2's and other causal LMs' heads) gets two
gradients in ORT's training graph: the head's weight gradient (``ort_hf::weight_grad``, a PyTorch
product, ``cpu_weight_grad.py``) and the embedding's (``ort_hf::embedding_dense_grad``,
``csrc/cpu_embedding_grad.cpp``), which ORT's ``Sum`` adds. Both are vocabulary-sized (47 MB for
BERT's 30,522 x 384), while the embedding's touches only the batch's rows: it zeroes a whole table,
and the ``Sum`` reads two and writes a third. Here the pair becomes one ``ATen`` node,
``ort_hf::embedding_dense_grad_add_``, which adds the embedding's rows into the head's gradient where
it lies: the same values bit for bit (each row's contributions summed first, from zero, as the
embedding kernel sums them; only a zero's sign can differ, -0 against +0).

The head's gradient is written in place, so the rewrite takes only a ``Sum`` of exactly these two,
whose head gradient comes from ``ort_hf::weight_grad`` (its buffer is PyTorch's, handed to ORT through
DLPack, never a block ORT's memory planner reuses) and is read by nothing else. It runs after
``cpu_kernel_swaps`` (whose embedding kernel it takes: ``ORTOptions.cpu_embedding_grad_kernel``), behind
``ORTOptions.cpu_tied_embedding_grad``.
"""

from __future__ import annotations

from onnx import GraphProto, helper

from .._onnx_graph import aten_operator, readers_of, rebuild_nodes
from .cpu_weight_grad import OPERATOR as WEIGHT_GRAD

_ATEN = "org.pytorch.aten"
EMBEDDING_GRAD = "ort_hf::embedding_dense_grad"
OPERATOR = "ort_hf::embedding_dense_grad_add_"


def add_tied_embedding_grads(graph: GraphProto) -> int:
    """Rewrite ``graph`` in place; returns how many ``Sum`` nodes became the in-place kernel."""
    original = list(graph.node)  # one wrapper per node, so that id() names it throughout
    producers = {out: node for node in original for out in node.output if out}
    readers = readers_of(original)
    graph_outputs = {out.name for out in graph.output}

    def only_for(name: str, node) -> bool:  # read by `node` alone, once, and not a graph output
        return name not in graph_outputs and [id(r) for r in readers.get(name, [])] == [id(node)]

    def made_by(name: str) -> bytes | None:  # the ATen operator that computes `name`
        operator = aten_operator(producers[name]) if name in producers else None
        return None if operator is None else operator.s

    replaced, dropped = {}, set()
    for node in original:
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        roles = {made_by(name): name for name in node.input}
        head, table = roles.get(WEIGHT_GRAD.encode()), roles.get(EMBEDDING_GRAD.encode())
        if head is None or table is None or not only_for(head, node) or not only_for(table, node):
            continue
        embedding = producers[table]
        if id(embedding) in dropped:
            continue
        replaced[id(node)] = helper.make_node(
            "ATen",
            [head, *embedding.input],
            [node.output[0]],
            name=f"{node.name or node.output[0]}/ort_hf_embedding_grad_add",
            domain=_ATEN,
            operator=OPERATOR,
            overload_name="",
        )
        dropped.add(id(embedding))
    if replaced:
        rebuild_nodes(graph, original, replaced, dropped, [])
    return len(replaced)
