"""Small look-ups over an ONNX graph's nodes, shared by the engine's rewrites and the loss checks."""

from __future__ import annotations

from collections.abc import Iterable

from onnx import GraphProto, helper


def readers_of(nodes: Iterable) -> dict[str, list]:
    """Each value name -> the nodes (in order) that take it as an input."""
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def aten_operator(node):
    """The ``operator`` attribute of an ATen node of PyTorch's domain (``org.pytorch.aten``), else None."""
    if node.op_type != "ATen" or node.domain != "org.pytorch.aten":
        return None
    return next((a for a in node.attribute if a.name == "operator"), None)


def set_elem_types(graph: GraphProto, types: dict[str, int]) -> None:
    """Give ``types``' values their element type in ``graph.value_info``, a declared shape kept (ORT
    infers no type for an ATen node's outputs). Empties ``types``."""
    for info in graph.value_info:
        if info.name in types:
            info.type.tensor_type.elem_type = types.pop(info.name)
    graph.value_info.extend(helper.make_tensor_value_info(name, elem_type, None) for name, elem_type in types.items())
    types.clear()


def rebuild_nodes(
    graph: GraphProto, original: list, replaced: dict[int, object], dropped: set[int], first: list
) -> None:
    """Set ``graph``'s nodes to ``first``, then ``original`` (its nodes, held in a list so that their
    ``id()`` stay theirs) with each node whose id is in ``replaced`` swapped for its replacement and
    those in ``dropped`` left out."""
    nodes = first + [replaced.get(id(node), node) for node in original if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
