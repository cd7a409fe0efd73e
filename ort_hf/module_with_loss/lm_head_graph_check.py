"""Read from ORT's training graph where the vocabulary projection runs: on the gathered rows whose
labels count (what ``fused_lm_head.py`` asks for), or on every position.

Check graphs, not intentions: the forward MatMul that takes the LM head's weight must read its
other operand from a ``Gather`` whose indices come from a ``NonZero`` (the used positions).
"""

from __future__ import annotations

from .._onnx_graph import readers_of

# Ops that pass a tensor through unchanged in content (only its shape or type).
_PASS_THROUGH = {"Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze", "Transpose", "Flatten"}
_PROJECTIONS = {"MatMul", "FusedMatMul", "Gemm"}


def vocab_projections(graph, weight_name: str) -> list[tuple[str, str]]:
    """``(projection node, what its activation comes from)`` for each forward projection by the
    weight ``weight_name`` (a parameter name; ORT may prefix it). The source is ``"gathered rows"``
    when it is a Gather indexed by a NonZero, else the op that produced it."""
    graph = getattr(graph, "graph", graph)
    names = {v.name for v in (*graph.input, *graph.initializer)}
    weight = next((n for n in names if n == weight_name or n.endswith("." + weight_name)), None)
    if weight is None:
        raise ValueError(f"{weight_name} is not an input of the training graph")
    producer = {out: node for node in graph.node for out in node.output}
    consumers = readers_of(graph.node)
    weights, found = {weight}, []
    frontier = [weight]
    while frontier:  # the weight as the projections see it (transposed, cast...)
        for node in consumers.get(frontier.pop(), []):
            if node.op_type in _PASS_THROUGH:
                weights.update(node.output)
                frontier.extend(node.output)
            elif node.op_type in _PROJECTIONS:
                activation = next((n for n in node.input[:2] if n not in weights), None)
                if activation is not None and "_grad" not in activation:  # forward, not the gradient graph
                    found.append((node.name, _source(activation, producer)))
    return found


def _source(name: str, producer: dict) -> str:
    node = producer.get(name)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producer.get(node.input[0])
    if node is None:
        return "graph input"
    if node.op_type in ("Gather", "GatherND") and _comes_from(node.input[1], "NonZero", producer):
        return "gathered rows"
    return node.op_type


def _comes_from(name: str, op_type: str, producer: dict, depth: int = 8) -> bool:
    node = producer.get(name)
    if node is None or depth == 0:
        return False
    return node.op_type == op_type or any(_comes_from(i, op_type, producer, depth - 1) for i in node.input)


def projection_on_gathered_rows(graph, weight_name: str) -> bool:
    """Whether every forward vocabulary projection in ``graph`` runs on gathered rows (and there is one)."""
    found = vocab_projections(graph, weight_name)
    return bool(found) and all(source == "gathered rows" for _, source in found)
