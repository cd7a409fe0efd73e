"""ORT's training graph reads weights in place instead of through a Transpose copy per step."""

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from parity import assert_parity, run_parity
from tiny_models import FAMILIES, build, make_batch

from ort_hf.engine.graph_rewrites import fold_weight_transposes


def _graph(extra_reader: bool):
    """y = x @ W^T (MatMul on Transpose(W)); dx = dy @ Transpose(W)^T (FusedMatMul transB=1, as
    ORT's gradient builder writes it); optionally an Add that also reads Transpose(W)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Wt"], ["y"]),
             helper.make_node("FusedMatMul", ["dy", "Wt"], ["dx"], domain="com.microsoft", transB=1, alpha=2.0)]
    outputs = [helper.make_tensor_value_info("y", f, None), helper.make_tensor_value_info("dx", f, None)]
    if extra_reader:
        nodes.append(helper.make_node("Add", ["Wt", "Wt"], ["w2"]))
        outputs.append(helper.make_tensor_value_info("w2", f, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 3, 4]),
                                           helper.make_tensor_value_info("W", f, [5, 4]),
                                           helper.make_tensor_value_info("dy", f, [2, 3, 5])], outputs)
    opsets = [helper.make_opsetid("", 16), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)  # ORT 1.19 reads IR <= 10


def _run(model):
    import onnxruntime

    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 4), dtype=np.float32), "W": rng.standard_normal((5, 4), dtype=np.float32),
             "dy": rng.standard_normal((2, 3, 5), dtype=np.float32)}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_weight_transposes_fold_into_the_matmuls_with_the_same_results():
    model = _graph(extra_reader=False)
    expected = _run(model)
    assert fold_weight_transposes(model.graph) == 1
    assert [n.op_type for n in model.graph.node] == ["FusedMatMul", "FusedMatMul"]
    assert all(n.input[1] == "W" for n in model.graph.node)
    for got, want in zip(_run(model), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_transpose_with_another_reader_stays():
    model = _graph(extra_reader=True)
    before = onnx.helper.printable_graph(model.graph)
    assert fold_weight_transposes(model.graph) == 0
    assert onnx.helper.printable_graph(model.graph) == before


def test_bert_training_graph_reads_no_weight_through_a_transpose():
    gen = torch.Generator().manual_seed(3)
    result = run_parity(build(FAMILIES["bert-cls"]), [make_batch("cls", gen) for _ in range(2)])
    assert_parity(*result)
    graph = result[-1].training_graph().graph
    weights = {i.name for i in graph.input if i.name.startswith("_original_module.")}
    assert not [n.input[0] for n in graph.node if n.op_type == "Transpose" and n.input[0] in weights]
    assert any(n.op_type == "FusedMatMul" and n.input[1] in weights for n in graph.node)
