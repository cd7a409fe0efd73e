"""Rewrites of ORT's training graph (forward and gradient) before its session is built.

ORT applies the functions registered with its ``GraphOptimizerRegistry`` to the optimised training
graph between the gradient build and the session (``_training_manager.py``, ``_build_graph``).
"""

from __future__ import annotations

from collections import defaultdict

_MS = "com.microsoft"
_registered = False


def _attr(node, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            import onnx

            return onnx.helper.get_attribute_value(a)
    return default


def _set_int_attr(node, name: str, value: int) -> None:
    import onnx

    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _reads_as_matmul_b(node, index: int) -> bool:
    if index != 1:
        return False
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
        return True
    return node.op_type == "FusedMatMul" and node.domain == _MS and not _attr(node, "transBatchB", 0)


def fold_weight_transposes(graph) -> int:
    """Fold ``Transpose(W)`` of a 2-D float weight into the matmuls that read it.

    TorchScript exports ``nn.Linear`` on 3-D activations as ``MatMul(x, Transpose(W))``, and the
    gradient graph reads that transposed copy again (``dx = dy @ Transpose(W)^T``): every step
    copies every weight once and holds the copies from forward to backward, frozen ones included
    (LoRA's whole base model). PyTorch reads the weight transposed in place. Each reader becomes
    a ``FusedMatMul`` with ``transB`` flipped on ``W`` itself; a Transpose with any other reader
    stays. Returns the number of Transposes removed."""
    import onnx

    weights = {i.name for i in graph.input
               if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and len(i.type.tensor_type.shape.dim) == 2}
    readers = defaultdict(list)
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers[name].append((node, index))
    graph_outputs = {o.name for o in graph.output}
    folded = []
    for node in graph.node:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or node.input[0] not in weights:
            continue
        if list(_attr(node, "perm", [1, 0])) != [1, 0]:
            continue
        users = readers.get(node.output[0], [])
        if not users or node.output[0] in graph_outputs or not all(_reads_as_matmul_b(u, i) for u, i in users):
            continue
        for user, _ in users:
            user.input[1] = node.input[0]
            if user.op_type == "MatMul":
                user.op_type, user.domain = "FusedMatMul", _MS
                _set_int_attr(user, "transB", 1)
            else:
                _set_int_attr(user, "transB", 1 - int(_attr(user, "transB", 0)))
        folded.append(node)
    gone = {n.output[0] for n in folded}
    for node in folded:
        graph.node.remove(node)
    for info in [v for v in graph.value_info if v.name in gone]:
        graph.value_info.remove(info)
    return len(folded)


def register() -> None:
    """Register the rewrites with ORT for every model and device (once per process)."""
    global _registered
    if _registered:
        return
    from onnxruntime.training.ortmodule.graph_optimizer_registry import GraphOptimizerRegistry

    GraphOptimizerRegistry.register("all", "all", 0, fold_weight_transposes)
    _registered = True
