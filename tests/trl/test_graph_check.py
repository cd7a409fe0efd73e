"""graph_check reads where the vocabulary projection runs; it must say no for a projection on every position."""

from onnx import TensorProto, helper

from ort_hf.module_with_loss.lm_head_graph_check import projection_on_gathered_rows, vocab_projections


def _graph(gathered: bool):
    nodes = [helper.make_node("Transpose", ["lm_head.weight"], ["wt"], perm=[1, 0])]
    if gathered:
        nodes += [
            helper.make_node("NonZero", ["mask"], ["nz"]),
            helper.make_node("Squeeze", ["nz"], ["rows"]),
            helper.make_node("Gather", ["hidden", "rows"], ["picked"]),
            helper.make_node("MatMul", ["picked", "wt"], ["logits"]),
        ]
    else:
        nodes += [
            helper.make_node("Relu", ["hidden"], ["normed"]),
            helper.make_node("MatMul", ["normed", "wt"], ["logits"]),
        ]
    nodes.append(helper.make_node("MatMul", ["logits_grad", "wt"], ["hidden_grad"]))  # the gradient graph's: ignored
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("hidden", "logits_grad")]
    inputs += [
        helper.make_tensor_value_info("mask", TensorProto.BOOL, None),
        helper.make_tensor_value_info("_original_module.model.lm_head.weight", TensorProto.FLOAT, [9, 4]),
    ]
    for node in nodes:
        node.input[:] = ["_original_module.model.lm_head.weight" if i == "lm_head.weight" else i for i in node.input]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, []))


def test_projection_on_gathered_rows_is_recognised():
    assert vocab_projections(_graph(True), "model.lm_head.weight") == [("", "gathered rows")]
    assert projection_on_gathered_rows(_graph(True), "model.lm_head.weight")


def test_projection_on_every_position_is_not():
    assert vocab_projections(_graph(False), "model.lm_head.weight") == [("", "Relu")]
    assert not projection_on_gathered_rows(_graph(False), "model.lm_head.weight")
