"""csrc/cpu_embedding_grad.cpp and its swap (engine/cpu_kernel_swaps.py): ort_hf's embedding
gradient gives aten::embedding_backward's values bit for bit, called directly and as ORT's ATen
node in a session; it reuses its buffer only once nothing holds the previous result."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from ort_hf.engine.cpu_kernel_swaps import swap_kernels

ROWS, DIM, PAD = 50, 8, 3


pytestmark = pytest.mark.usefixtures("aten_nodes_run")


def _inputs(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, ROWS, (4, 9), generator=g)
    indices[0, :4] = PAD  # the padding row gets contributions that must not count
    indices[1, :5] = 7  # a row summed from several positions, in index order
    return torch.randn(4, 9, DIM, generator=g, dtype=dtype), indices


def _ours(grad, indices, padding_idx=PAD, scale=False, sparse=False):
    return torch.ops.ort_hf.embedding_dense_grad(grad, indices, ROWS, padding_idx, scale, sparse)


def _aten(grad, indices, padding_idx=PAD, scale=False, sparse=False):
    return torch.ops.aten.embedding_backward(grad, indices, ROWS, padding_idx, scale, sparse)


@pytest.mark.parametrize("padding_idx", [PAD, -1])
def test_same_bits_as_aten(padding_idx):
    grad, indices = _inputs(0)
    want = _aten(grad, indices, padding_idx)
    assert torch.equal(_ours(grad, indices, padding_idx), want)
    assert (want[PAD] == 0).all() == (padding_idx == PAD)


def test_buffer_is_reused_only_when_released_and_comes_back_zeroed():
    first_grad, indices = _inputs(1)
    second_grad, _ = _inputs(2)
    held = _ours(first_grad, indices)
    kept = held.clone()
    other = _ours(second_grad, indices)  # `held` is still in use: another buffer, `held` untouched
    assert other.data_ptr() != held.data_ptr() and torch.equal(held, kept)
    assert torch.equal(other, _aten(second_grad, indices))
    buffers = {held.data_ptr(), other.data_ptr()}
    del held, other
    few_grad, few = second_grad[:, :2], indices[:, :2]
    again = _ours(few_grad, few)  # both released: one of them again, zeroed but for these rows
    assert again.data_ptr() in buffers
    assert torch.equal(again, _aten(few_grad, few))
    row = again[7]  # a view keeps its buffer in use
    row_before = row.clone()
    del again
    last = _ours(first_grad, indices)
    assert last.data_ptr() != row.untyped_storage().data_ptr() and torch.equal(row, row_before)
    assert torch.equal(last, _aten(first_grad, indices))


def _edge(rows, index, dim=DIM, padding_idx=-1):
    indices = torch.tensor(index, dtype=torch.long)
    grad = torch.randn(*indices.shape, dim, generator=torch.Generator().manual_seed(9))
    return grad, indices, rows, padding_idx


# What aten::embedding_backward accepts beyond the usual: no rows to gather from (padding
# elimination's row gathers), no indices, indices outside [0, rows) (they add nothing there: each
# of torch's threads adds only the indices of its own range of rows), no embedding width.
EDGES = {
    "no rows, no indices": _edge(0, []),
    "no rows, an index": _edge(0, [0]),
    "no rows, indices in a batch": _edge(0, [[0, 0], [1, 0]]),
    "rows, no indices": _edge(5, [[], []]),
    "indices past the rows": _edge(5, [1, 5, 9, 1]),
    "negative indices": _edge(5, [-1, 2, -5]),
    "padding_idx past the rows": _edge(5, [1, 7, 2], padding_idx=7),
    "no width": _edge(5, [1, 2, 1], dim=0),
    "one index, no batch": _edge(5, 3),
}


@pytest.mark.parametrize("case", EDGES)
def test_edge_inputs_give_atens_result(case):
    grad, indices, rows, padding_idx = EDGES[case]
    want = torch.ops.aten.embedding_backward(grad, indices, rows, padding_idx, False, False)
    got = torch.ops.ort_hf.embedding_dense_grad(grad, indices, rows, padding_idx, False, False)
    assert got.shape == want.shape and torch.equal(got, want)


def test_what_it_does_not_handle_is_atens():
    grad, indices = _inputs(3)
    assert torch.equal(_ours(grad, indices, scale=True), _aten(grad, indices, scale=True))
    grad64, _ = _inputs(3, torch.float64)
    assert torch.equal(_ours(grad64, indices), _aten(grad64, indices))
    assert _ours(grad, indices, sparse=True).is_sparse


def _model(rows=ROWS, table="weight"):
    """The embedding's lookup and its gradient, as ORT's training graph holds them: the table is the
    graph input ``weight`` (a parameter), or with ``table="activation"`` a tensor the graph computes
    (as padding elimination's row gathers look up)."""
    consts = [
        helper.make_tensor(name, TensorProto.INT64, [], [value])
        for name, value in (("num_weights", rows), ("padding_idx", PAD))
    ]
    consts += [helper.make_tensor(name, TensorProto.BOOL, [], [False]) for name in ("scale", "sparse")]
    lookup = [helper.make_node("Identity", ["weight"], ["activation"])] if table == "activation" else []
    lookup.append(
        helper.make_node(
            "ATen",
            [table, "indices", "padding_idx", "scale", "sparse"],
            ["rows"],
            name="emb",
            domain="org.pytorch.aten",
            operator="embedding",
            overload_name="",
        )
    )
    node = helper.make_node(
        "ATen",
        ["grad", "indices", "num_weights", "padding_idx", "scale", "sparse"],
        ["weight_grad"],
        name="emb_grad",
        domain="org.pytorch.aten",
        operator="embedding_backward",
        overload_name="",
    )
    graph = helper.make_graph(
        [*lookup, node],
        "g",
        [
            helper.make_tensor_value_info("grad", TensorProto.FLOAT, [4, 9, DIM]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [4, 9]),
            helper.make_tensor_value_info("weight", TensorProto.FLOAT, [ROWS, DIM]),
        ],
        [
            helper.make_tensor_value_info("weight_grad", TensorProto.FLOAT, [rows, DIM]),
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [4, 9, DIM]),
        ],
        consts,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("org.pytorch.aten", 1)], ir_version=8
    )


def test_swapped_node_computes_atens_values_in_a_session():
    import onnxruntime as ort

    model = _model()
    assert swap_kernels(model.graph) == {"ATen": 1}
    operator = {a.name: a.s for a in model.graph.node[-1].attribute}["operator"]
    assert operator == b"ort_hf::embedding_dense_grad"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    weight = np.zeros((ROWS, DIM), np.float32)
    for seed in (4, 5, 6):  # later calls may write into the first call's buffer
        grad, indices = _inputs(seed)
        got = session.run(["weight_grad"], {"grad": grad.numpy(), "indices": indices.numpy(), "weight": weight})[0]
        np.testing.assert_array_equal(got, _aten(grad, indices).numpy())


def test_a_table_without_rows_gives_atens_empty_gradient_in_a_session():
    import onnxruntime as ort

    model = _model(rows=0)
    assert swap_kernels(model.graph) == {"ATen": 1}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    grad, indices = _inputs(10)
    got = session.run(
        ["weight_grad"], {"grad": grad.numpy(), "indices": indices.numpy(), "weight": np.zeros((ROWS, DIM), np.float32)}
    )[0]
    want = torch.ops.aten.embedding_backward(grad, indices, 0, PAD, False, False)
    assert got.shape == (0, DIM) and tuple(want.shape) == (0, DIM)


def test_lookups_into_activations_keep_atens_kernel():
    # Padding elimination's row gathers: a table whose row count changes every batch gains nothing
    # from a kept buffer, and its buffers would evict the vocabulary-sized one.
    model = _model(table="activation")
    assert swap_kernels(model.graph) == {}
    assert {a.name: a.s for a in model.graph.node[-1].attribute}["operator"] == b"embedding_backward"


def test_release_leaves_results_in_use_intact():
    from ort_hf.engine.cpu_kernel_swaps import release_kernel_buffers

    grad, indices = _inputs(7)
    held = _ours(grad, indices)
    release_kernel_buffers()  # what a wrapped model's end calls
    _ours(*_inputs(8))
    assert torch.equal(held, _aten(grad, indices))
