"""Casts to the type their input already has, taken out of the exported graph before ORT builds on it.

A model that upcasts what is already float32 (``x.float().square()``: DeepSeek-V4's unweighted
RMSNorm, ``F.linear(x.float(), w.float())``) exports a ``Cast(to=FLOAT)`` of a float tensor. ORT
1.19.2's pre-training ``PropagateCastOps`` pass (on by default in ORTModule, ``FLOOD_FILL`` level 1)
removes such casts in ``RemoveUnnecessaryCasts``, and throws ``Graph::RemoveEdge ... Argument
mismatch when removing edge`` when the cast's output feeds one node twice (``square`` exports as
``Mul(y, y)``); the graph build fails and so does the model. A cast to its own input's type computes
nothing (forward or gradient), so the exported forward is rewired around it here, where ORT's pass
then finds nothing to remove. A cast whose output is a graph output, or whose input's type the graph
does not record, stays. Can go with ORTModule.
"""

from __future__ import annotations

import onnx


def _elem_types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.WhichOneof("value") == "tensor_type" and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    return types


def _rename_inputs(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Every read of a renamed value, in subgraphs too (their outer-scope reads are by name)."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                _rename_inputs(sub, renames)


def drop_identity_casts(model: onnx.ModelProto) -> int:
    """Remove, in place, the top-level ``Cast`` nodes whose ``to`` is their input's type; return how many."""
    graph = model.graph
    types = _elem_types(graph)
    outputs = {value.name for value in graph.output}
    renames, keep = {}, []
    for node in graph.node:
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and node.output[0] not in outputs:
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            source = renames.get(node.input[0], node.input[0])
            if to is not None and types.get(source) == to:
                renames[node.output[0]] = source
                continue
        keep.append(node)
    if not renames:
        return 0
    del graph.node[:]
    graph.node.extend(keep)
    _rename_inputs(graph, renames)
    dropped = set(renames)
    kept_info = [v for v in graph.value_info if v.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return len(renames)
