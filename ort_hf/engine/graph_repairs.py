"""Rewrites of the exported forward graph that ORT 1.19.2's gradient graph builder needs.

All run on the post-export model, before ORT builds the gradient graph from it
(``compat._bridge_post_export_repairs``); all go with ORTModule.

- :func:`drop_noop_casts`: a ``Cast`` to the type its input already has (``x.to(torch.float32)``
  of a float32 ``x``, as in transformers' ``torch_chunk_gated_delta_rule``) is an identity. ORT's
  PropagateCastOps removes such casts itself, but when the cast's output feeds one node on two
  inputs (``Mul(y, y)``, an l2 norm) its edge removal fails: ``graph.cc:1591 Argument mismatch
  when removing edge``. Removed here, the consumers read the input directly: the same values.
- :func:`drop_empty_concat_inputs`: ORT's ``Concat`` gradient (opset 13+) defines the gradient of
  every input, needed or not, under the input's name plus ``_grad``. A tensor no gradient reaches,
  read by two ``Concat`` nodes that are on the gradient path, so gets its gradient defined twice:
  "Duplicate definition of name (..._grad)". Inkling2's block states start as such a tensor, an
  empty zero state (``new_zeros(..., 0, hidden)``) that every block's ``torch.cat`` reads. An input
  of size 0 on the concatenation axis adds nothing to the output, so it is dropped from the
  ``Concat``: the same values.
- :func:`detach_function_inputs`: a custom ``torch.autograd.Function`` runs in ORT as a PythonOp,
  and ORT differentiates through every float input it can reach. When the Function's backward
  returns None for such an input (PhiMoE's ``PhimoeMultiplier``, whose backward is an estimate
  for the router scores alone), the PythonOpGrad output ORT wired to that input's producer stays
  empty, and the producer's gradient kernel fails ("Missing Input: ..._grad", PhiMoE's
  ``GatherElementsGrad``). Those inputs (:data:`FUNCTION_INPUTS_WITHOUT_GRADIENT`) are read
  through torch's ``detach_copy`` in an ORT ``ATen`` node whose edge stops the gradient
  (:data:`STOP_GRADIENT_EDGES`): the same values, and no gradient, as the backward's None says.
- :func:`unreachable_parameters`: a parameter that reaches the outputs only through integer values
  (the indices of a ``TopK`` or ``ArgMax``, a sparse-attention indexer) has no gradient in PyTorch
  (its ``.grad`` stays None); ORT refuses to build the gradient graph for it ("Cannot compute the
  partial derivative ... unreachable from the output node(s)").
"""

from __future__ import annotations

from collections import deque

import onnx
from onnx import helper

# The element types ORT differentiates through (gradient_graph_builder.h, GRAD_ALLOWED_TYPES).
_DIFFERENTIABLE = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def _element_types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {init.name: init.data_type for init in graph.initializer}
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    return types


def _subgraph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name a node inside a subgraph (If, Loop, Scan) reads or writes."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                for inner in sub.node:
                    names.update(inner.input)
                    names.update(inner.output)
                names |= _subgraph_names(sub)
    return names


def drop_noop_casts(model: onnx.ModelProto) -> int:
    """Remove, in place, every top-level ``Cast`` whose input already has the target element type
    (known from the model's value infos); return how many. A cast whose output is a graph output
    stays (its name is the output's)."""
    graph = model.graph
    types = _element_types(graph)
    outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        for i, name in enumerate(node.input):  # an earlier removal renames what later nodes read
            if name in renamed:
                node.input[i] = renamed[name]
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if (
            node.op_type == "Cast"
            and node.domain in ("", "ai.onnx")
            and node.output[0] not in outputs
            and to is not None
            and types.get(node.input[0]) == to
        ):
            renamed[node.output[0]] = node.input[0]
            continue
        kept.append(node)
    if not renamed:
        return 0
    # Subgraphs may read a removed cast's output from the outer scope.
    stack = [attr for node in kept for attr in node.attribute]
    while stack:
        attr = stack.pop()
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in sub.node:
                for i, name in enumerate(inner.input):
                    if name in renamed:
                        inner.input[i] = renamed[name]
                stack.extend(inner.attribute)
    del graph.node[:]
    graph.node.extend(kept)
    infos = [v for v in graph.value_info if v.name not in renamed]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return len(renamed)


def _shapes(graph: onnx.GraphProto) -> dict[str, list]:
    shapes = {init.name: [int(d) for d in init.dims] for init in graph.initializer}
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            shapes[info.name] = [
                d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim
            ]
    return shapes


def drop_empty_concat_inputs(model: onnx.ModelProto) -> int:
    """Remove, in place, from every top-level ``Concat`` the inputs whose size on the
    concatenation axis is 0 in the model's value infos (one input always stays); return how many."""
    shapes = _shapes(model.graph)
    dropped = 0
    for node in model.graph.node:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        axis = next(a.i for a in node.attribute if a.name == "axis")
        empty = []
        for name in node.input:
            shape = shapes.get(name)
            empty.append(shape is not None and -len(shape) <= axis < len(shape) and shape[axis] == 0)
        if all(empty) or not any(empty):
            continue
        kept = [name for name, is_empty in zip(node.input, empty) if not is_empty]
        dropped += len(node.input) - len(kept)
        del node.input[:]
        node.input.extend(kept)
    return dropped


# ``func_name`` of a PythonOp (the Function's qualified name) -> the positions, among the
# Function's arguments after ``ctx``, of the tensors its backward returns None for. Recheck when the
# model's code changes (transformers' modeling_phimoe.py).
FUNCTION_INPUTS_WITHOUT_GRADIENT = {
    "transformers.models.phimoe.modeling_phimoe.PhimoeMultiplier": (1, 2, 3, 4),
}
_ATEN = "org.pytorch.aten"
# detach_copy's input edge stops ORT's gradient, as torch's detach does (registered with ORT's
# gradient table by symbolics.register_training_symbolics).
STOP_GRADIENT_EDGES = {(_ATEN, "ATen", "detach_copy", ""): [0]}


def detach_function_inputs(model: onnx.ModelProto, table: dict | None = None) -> int:
    """Insert, in place, an ATen ``detach_copy`` before each float tensor input of a top-level
    PythonOp that ``table`` (default :data:`FUNCTION_INPUTS_WITHOUT_GRADIENT`) lists; return how
    many."""
    table = FUNCTION_INPUTS_WITHOUT_GRADIENT if table is None else table
    graph = model.graph
    types = _element_types(graph)
    infos = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    nodes, added = [], 0
    for node in graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "PythonOp" and "func_name" in attrs and attrs["func_name"].s.decode() in table:
            convention = attrs["input_convention"].s.decode()
            tensor_index = {arg: convention[:arg].count("d") for arg, kind in enumerate(convention) if kind == "d"}
            for arg in table[attrs["func_name"].s.decode()]:
                i = tensor_index.get(arg)
                if i is None or types.get(node.input[i]) not in _DIFFERENTIABLE:
                    continue
                detached = f"{node.input[i]}_detached_for_{node.name}_{i}"
                nodes.append(
                    helper.make_node(
                        "ATen",
                        [node.input[i]],
                        [detached],
                        f"{node.name}/detach_copy_{i}",
                        domain=_ATEN,
                        operator="detach_copy",
                        overload_name="",
                    )
                )
                if node.input[i] in infos:  # ORT infers no type for an ATen node's output
                    info = onnx.ValueInfoProto()
                    info.CopyFrom(infos[node.input[i]])
                    info.name = detached
                    graph.value_info.append(info)
                node.input[i] = detached
                added += 1
        nodes.append(node)
    if added:
        del graph.node[:]
        graph.node.extend(nodes)
        if not any(o.domain == _ATEN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(_ATEN, 1))
    return added


def unreachable_parameters(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """Those of ``names`` (graph inputs) from which no differentiable path reaches a graph output.

    The walk goes back from the outputs' producers over the inputs of the nodes it reaches, and
    stops only at values of a known element type ORT does not differentiate (integers, bools), as
    ORT's own walk does (GradientGraphBuilder::ReverseBFSWithStopGradient). ORT also stops at some
    float edges (a Pow's exponent, a Dropout's ratio) and at values of unknown type: those are
    crossed here, so a name returned here is unreachable for ORT too; one ORT still refuses is
    refused loudly, as before, never silently left without a gradient. A name read inside a
    subgraph is always kept."""
    graph = model.graph
    types = _element_types(graph)
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    queue = deque(producer[o.name] for o in graph.output if o.name in producer)
    reached = set(queue)
    while queue:
        node = graph.node[queue.popleft()]
        for name in node.input:
            if not name or name not in producer or types.get(name, onnx.TensorProto.FLOAT) not in _DIFFERENTIABLE:
                continue
            index = producer[name]
            if index not in reached:
                reached.add(index)
                queue.append(index)
    read_by_reached = {name for i in reached for name in graph.node[i].input}
    read_by_reached |= _subgraph_names(graph)
    read_by_reached |= {o.name for o in graph.output}  # a parameter returned as is
    return [name for name in names if name not in read_by_reached]
