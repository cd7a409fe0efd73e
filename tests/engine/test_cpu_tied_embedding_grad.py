"""csrc/cpu_embedding_grad.cpp's embedding_dense_grad_add_ and its rewrite
(engine/cpu_tied_embedding_grad.py): a tied table's two gradients, the head's and the embedding's,
summed in place give ORT's Sum of them bit for bit, called directly and in an ORT session; a Sum the
rewrite cannot own stays ORT's."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from ort_hf.engine.cpu_tied_embedding_grad import OPERATOR, add_tied_embedding_grads

ROWS, DIM, PAD, TOKENS = 50, 8, 3, 36

pytestmark = pytest.mark.usefixtures("aten_nodes_run")


def _inputs(seed, dtype=torch.float32, outside=True):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, ROWS, (4, 9), generator=g)
    indices[0, :4] = PAD  # the padding row gets contributions that must not count
    indices[1, :5] = 7  # a row summed from several positions
    if outside:  # an index outside the table adds nothing, as in aten (not with scale_grad_by_freq,
        indices[2, 0] = ROWS + 2  # where aten counts it past the end of its counts: heap corruption)
    base = torch.randn(ROWS, DIM, generator=g, dtype=dtype)
    return base, torch.randn(4, 9, DIM, generator=g, dtype=dtype), indices


def _sum_of_both(base, grad, indices, padding_idx=PAD, scale=False):
    return base + torch.ops.aten.embedding_backward(grad, indices, ROWS, padding_idx, scale, False)


@pytest.mark.parametrize("padding_idx", [PAD, -1])
def test_adds_in_place_what_the_sum_gives(padding_idx):
    base, grad, indices = _inputs(0)
    want = _sum_of_both(base, grad, indices, padding_idx)
    got = torch.ops.ort_hf.embedding_dense_grad_add_(base, grad, indices, ROWS, padding_idx, False, False)
    assert got.data_ptr() == base.data_ptr()
    assert torch.equal(got, want)


def test_what_it_leaves_to_aten_gives_the_sum_too():
    base, grad, indices = _inputs(1, outside=False)
    want = _sum_of_both(base, grad, indices, scale=True)
    assert torch.equal(torch.ops.ort_hf.embedding_dense_grad_add_(base, grad, indices, ROWS, PAD, True, False), want)
    base, grad, indices = _inputs(1, torch.float64)
    want = _sum_of_both(base, grad, indices)
    assert torch.equal(torch.ops.ort_hf.embedding_dense_grad_add_(base, grad, indices, ROWS, PAD, False, False), want)


def _aten_node(operator, inputs, output):
    return helper.make_node("ATen", inputs, [output], domain="org.pytorch.aten", operator=operator, overload_name="")


def _model(head_op="ort_hf::weight_grad", head_also_read=False, extra_sum_input=False):
    """A tied table's gradient as ORT's training graph holds it once ort_hf's kernels are in: the
    head's weight gradient ``x^T dlogits`` (``ort_hf::weight_grad``, or ORT's Gemm), the embedding's
    (``ort_hf::embedding_dense_grad``), and their Sum, the table's gradient."""
    consts = [
        helper.make_tensor(name, TensorProto.INT64, [], [value])
        for name, value in (("num_weights", ROWS), ("padding_idx", PAD), ("threads", 1))
    ]
    consts += [helper.make_tensor(name, TensorProto.BOOL, [], [False]) for name in ("scale", "sparse")]
    if head_op == "Gemm":
        head = helper.make_node("Gemm", ["dlogits", "x"], ["head_grad"], transA=1)
    else:
        head = _aten_node(head_op, ["dlogits", "x", "threads"], "head_grad")
    nodes = [
        head,
        _aten_node(
            "ort_hf::embedding_dense_grad",
            ["grad", "indices", "num_weights", "padding_idx", "scale", "sparse"],
            "table_grad",
        ),
        helper.make_node("Sum", ["head_grad", "table_grad"] + (["dlogits_t"] if extra_sum_input else []), ["wte_grad"]),
    ]
    if extra_sum_input:
        nodes.insert(0, helper.make_node("Transpose", ["dlogits_x"], ["dlogits_t"]))
    outputs = [helper.make_tensor_value_info("wte_grad", TensorProto.FLOAT, [ROWS, DIM])]
    if head_also_read:
        nodes.append(helper.make_node("Neg", ["head_grad"], ["head_neg"]))
        outputs.append(helper.make_tensor_value_info("head_neg", TensorProto.FLOAT, [ROWS, DIM]))
    inputs = [
        helper.make_tensor_value_info("dlogits", TensorProto.FLOAT, [TOKENS, ROWS]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [TOKENS, DIM]),
        helper.make_tensor_value_info("grad", TensorProto.FLOAT, [4, 9, DIM]),
        helper.make_tensor_value_info("indices", TensorProto.INT64, [4, 9]),
    ]
    if extra_sum_input:
        inputs.append(helper.make_tensor_value_info("dlogits_x", TensorProto.FLOAT, [DIM, ROWS]))
    typed = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("head_grad", "table_grad")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, consts, value_info=typed)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("org.pytorch.aten", 1)], ir_version=8
    )


def _feeds(seed):
    g = torch.Generator().manual_seed(seed)
    _, grad, indices = _inputs(seed)
    return {
        "dlogits": torch.randn(TOKENS, ROWS, generator=g).numpy(),
        "x": torch.randn(TOKENS, DIM, generator=g).numpy(),
        "grad": grad.numpy(),
        "indices": indices.numpy(),
    }


def test_rewritten_sum_gives_orts_sum_bit_for_bit_in_a_session():
    import onnxruntime as ort

    original = _model()
    rewritten = _model()
    assert add_tied_embedding_grads(rewritten.graph) == 1
    ops = [{a.name: a.s for a in n.attribute}.get("operator", n.op_type.encode()) for n in rewritten.graph.node]
    assert ops == [b"ort_hf::weight_grad", OPERATOR.encode()], ops  # the embedding kernel and the Sum are gone
    sessions = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (original, rewritten)
    ]
    for seed in (4, 5, 6):  # later calls may write into buffers earlier calls used
        want, got = (s.run(["wte_grad"], _feeds(seed))[0] for s in sessions)
        np.testing.assert_array_equal(got, want)
        assert np.abs(want).max() > 0


@pytest.mark.parametrize(
    "kw",
    [dict(head_op="Gemm"), dict(head_also_read=True), dict(extra_sum_input=True)],
    ids=["head-gradient-orts-own-buffer", "head-gradient-read-elsewhere", "sum-of-three"],
)
def test_a_sum_it_cannot_own_stays_orts(kw):
    model = _model(**kw)
    before = model.SerializeToString()
    assert add_tied_embedding_grads(model.graph) == 0
    assert model.SerializeToString() == before
