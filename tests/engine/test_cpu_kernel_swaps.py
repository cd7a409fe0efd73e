"""engine/cpu_kernel_swaps.py: ORT's cross-entropy node and its LogSoftmax + NLL replacement give
the same loss and log-probabilities in an ORT session, for each reduction, with class weights
and an ignored label; its gradient node runs as ort_hf's kernel with ORT's values, for 2-D and
3-D scores too; what either cannot translate exactly stays. A grouped 1-D ConvGrad runs as the
2-D one with torch's gradients; the ConvGrads ORT gets right stay, a grouped 3-D one is refused.
ORT's Gemm becomes FusedMatMul, which sums over no rows. The gradient of label sparsity's gather
runs as PyTorch's embedding_backward with ORT's values; a GatherGrad of other indices stays."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from ort_hf.engine.cpu_kernel_swaps import swap_kernels

N, C = 12, 7


def _model(reduction: str, weights: bool, ignore_as_input: bool = False):
    inputs = [
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [N, C]),
        helper.make_tensor_value_info("labels", TensorProto.INT64, [N]),
    ]
    inits = [helper.make_tensor("weight", TensorProto.FLOAT, [C], np.linspace(0.5, 2.0, C).tolist())]
    if ignore_as_input:
        inputs.append(helper.make_tensor_value_info("ignore", TensorProto.INT64, []))
    else:
        inits.append(helper.make_tensor("ignore", TensorProto.INT64, [], [-100]))
    node = helper.make_node(
        "SoftmaxCrossEntropyLossInternal",
        ["scores", "labels", "weight" if weights else "", "ignore"],
        ["loss", "log_prob"],
        domain="com.microsoft",
        name="sce",
        reduction=reduction,
        output_type=TensorProto.FLOAT,
    )
    loss_shape = [N] if reduction == "none" else []
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [
            helper.make_tensor_value_info("loss", TensorProto.FLOAT, loss_shape),
            helper.make_tensor_value_info("log_prob", TensorProto.FLOAT, [N, C]),
        ],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("com.microsoft", 1)], ir_version=8
    )


def _run(model, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weights", [False, True])
def test_swap_computes_what_ort_computes(reduction, weights):
    rng = np.random.default_rng(0)
    feeds = {
        "scores": (rng.standard_normal((N, C)) * 3).astype(np.float32),
        "labels": rng.integers(0, C, N).astype(np.int64),
    }
    feeds["labels"][::4] = -100
    model = _model(reduction, weights)
    expected = _run(model, feeds)
    assert swap_kernels(model.graph) == {"SoftmaxCrossEntropyLossInternal": 1}
    assert [n.op_type for n in model.graph.node] == ["LogSoftmax", "NegativeLogLikelihoodLoss"]
    for got, want in zip(_run(model, feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_label_to_ignore_that_is_not_a_constant_stays_with_ort():
    model = _model("mean", False, ignore_as_input=True)
    assert swap_kernels(model.graph) == {}
    assert [n.op_type for n in model.graph.node] == ["SoftmaxCrossEntropyLossInternal"]


def test_scores_of_another_precision_stay_with_ort():
    model = _model("mean", False)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    assert swap_kernels(model.graph) == {}


def _cross_entropy_grad_model(reduction: str, weights: bool, extra: int = 0, ignore: str = "constant"):
    """ORT's SoftmaxCrossEntropyLossInternalGrad(dY, log_prob, labels, weight, ignore) = d_scores;
    ``extra``: a trailing axis of that length ((N, C, extra) scores, (N, extra) labels); ``ignore``:
    "constant", "input" (a graph input) or "none" (no such input)."""
    lead = [N] + ([extra] if extra else [])
    scores_shape = [N, C] + ([extra] if extra else [])
    inputs = [
        helper.make_tensor_value_info("dy", TensorProto.FLOAT, lead if reduction == "none" else []),
        helper.make_tensor_value_info("log_prob", TensorProto.FLOAT, scores_shape),
        helper.make_tensor_value_info("labels", TensorProto.INT64, lead),
    ]
    inits = [helper.make_tensor("weight", TensorProto.FLOAT, [C], np.linspace(0.5, 2.0, C).tolist())]
    if ignore == "input":
        inputs.append(helper.make_tensor_value_info("ignore", TensorProto.INT64, []))
    elif ignore == "constant":
        inits.append(helper.make_tensor("ignore", TensorProto.INT64, [], [-100]))
    node = helper.make_node(
        "SoftmaxCrossEntropyLossInternalGrad",
        ["dy", "log_prob", "labels", "weight" if weights else "", "ignore" if ignore != "none" else ""],
        ["d_scores"],
        domain="com.microsoft",
        name="sce_grad",
        reduction=reduction,
        output_type=TensorProto.FLOAT,
    )
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("d_scores", TensorProto.FLOAT, scores_shape)], inits
    )
    opsets = [
        helper.make_opsetid("", 16),
        helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid("org.pytorch.aten", 1),
    ]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("extra", [0, 3], ids=["rows", "rows-by-positions"])
def test_cross_entropy_gradient_runs_on_pytorchs_kernel_with_ort_values(aten_nodes_run, reduction, weights, extra):
    rng = np.random.default_rng(0)
    scores = torch.from_numpy(rng.standard_normal([N, C] + ([extra] if extra else [])) * 3)
    lead = [N] + ([extra] if extra else [])
    feeds = {
        "dy": rng.standard_normal(lead if reduction == "none" else []).astype(np.float32),
        "log_prob": torch.log_softmax(scores, dim=1).float().numpy(),
        "labels": rng.integers(0, C, lead).astype(np.int64),
    }
    feeds["labels"][::4] = -100
    model = _cross_entropy_grad_model(reduction, weights, extra)
    (expected,) = _run(model, feeds)
    assert swap_kernels(model.graph, threads=2) == {"SoftmaxCrossEntropyLossInternalGrad": 1}
    assert sorted({n.op_type for n in model.graph.node}) == ["ATen", "Constant"]  # its int arguments
    (got,) = _run(model, feeds)
    assert got.shape == expected.shape
    assert (got[::4] == 0).all()  # the ignored rows
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "change", ["ignore-input", "no-ignore", "float16"], ids=["ignore-not-constant", "no-ignore", "float16"]
)
def test_cross_entropy_gradients_it_cannot_take_stay_with_ort(aten_nodes_run, change):
    model = _cross_entropy_grad_model(
        "mean", False, ignore={"ignore-input": "input", "no-ignore": "none"}.get(change, "constant")
    )
    if change == "float16":
        model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    assert swap_kernels(model.graph) == {}
    assert [n.op_type for n in model.graph.node] == ["SoftmaxCrossEntropyLossInternalGrad"]


def _gelu_grad_model(op_type: str, dtype=TensorProto.FLOAT):
    """One of ORT's GELU gradient nodes: (dY, X), and B for the ``Bias*`` forms."""
    rows, hidden = 33, 48
    inputs = [helper.make_tensor_value_info(name, dtype, [rows, hidden]) for name in ("dy", "x")]
    if op_type.startswith("Bias"):
        inputs.append(helper.make_tensor_value_info("bias", dtype, [hidden]))
    node = helper.make_node(op_type, [i.name for i in inputs], ["dx"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("dx", dtype, [rows, hidden])])
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 16),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid("org.pytorch.aten", 1),
        ],
        ir_version=8,
    )


def test_bias_gelu_gradient_runs_on_pytorchs_kernel_with_the_same_values(aten_nodes_run):
    rng = np.random.default_rng(0)
    feeds = {
        "dy": rng.standard_normal((33, 48)).astype(np.float32),
        "x": (rng.standard_normal((33, 48)) * 3).astype(np.float32),
        "bias": rng.standard_normal(48).astype(np.float32),
    }
    model = _gelu_grad_model("BiasGeluGrad_dX")
    expected = _run(model, feeds)
    assert swap_kernels(model.graph) == {"BiasGeluGrad_dX": 1}
    assert [(n.op_type, n.domain) for n in model.graph.node] == [("Add", ""), ("ATen", "org.pytorch.aten")]
    np.testing.assert_allclose(_run(model, feeds)[0], expected[0], rtol=1e-5, atol=1e-6)


def test_a_bias_gelu_gradient_of_another_precision_stays_with_ort():
    model = _gelu_grad_model("BiasGeluGrad_dX", TensorProto.DOUBLE)
    assert swap_kernels(model.graph) == {}


@pytest.mark.parametrize("op_type", ["FastGeluGrad", "BiasFastGeluGrad_dX"])
def test_tanh_gelu_gradient_runs_on_pytorchs_kernel_with_the_same_values(aten_nodes_run, op_type):
    rng = np.random.default_rng(0)
    feeds = {
        "dy": rng.standard_normal((33, 48)).astype(np.float32),
        "x": (rng.standard_normal((33, 48)) * 3).astype(np.float32),
    }
    if op_type == "BiasFastGeluGrad_dX":
        feeds["bias"] = rng.standard_normal(48).astype(np.float32)
    model = _gelu_grad_model(op_type)
    expected = _run(model, feeds)
    assert swap_kernels(model.graph) == {op_type: 1}
    kinds = [(n.op_type, n.domain) for n in model.graph.node]
    assert kinds == [("Add", "")] * ("bias" in feeds) + [("ATen", "org.pytorch.aten")]
    assert model.graph.node[-1].attribute[0].s == b"ort_hf::gelu_tanh_backward"
    got = _run(model, feeds)[0]
    x, dy = torch.tensor(feeds["x"] + feeds.get("bias", 0)), torch.tensor(feeds["dy"])
    torch_float32 = torch.ops.aten.gelu_backward(dy, x, approximate="tanh").numpy()
    truth = torch.ops.aten.gelu_backward(dy.double(), x.double(), approximate="tanh").numpy()
    np.testing.assert_allclose(got, torch_float32, rtol=1e-6, atol=1e-7)
    # ORT's kernel and PyTorch's differ by a few 1e-6 where x is far below 0 (float32 tanh saturates
    # there: PyTorch 0, ORT -2.9e-6, the float64 derivative -2.1e-6); both are that close to float64.
    for float32 in (got, expected[0]):
        np.testing.assert_allclose(float32, truth, rtol=1e-5, atol=3e-6)


def test_a_tanh_gelu_gradient_of_another_precision_stays_with_ort(aten_nodes_run):
    model = _gelu_grad_model("FastGeluGrad", TensorProto.DOUBLE)
    assert swap_kernels(model.graph) == {}


def _conv_grad_model(spatial: list[int], kernel: list[int], group: int, channels=8, outputs=("dx", "dw"), **attrs):
    """ORT's ConvGrad for a convolution of ``channels`` channels in ``group`` groups (as many out)."""
    x_shape, w_shape = [2, channels, *spatial], [channels, channels // group, *kernel]
    node = helper.make_node(
        "ConvGrad",
        ["dy", "x", "w"],
        list(outputs),
        domain="com.microsoft",
        name="conv_grad",
        kernel_shape=kernel,
        group=group,
        **attrs,
    )
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("dy", "x", "w")]
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o]
    )
    opsets = [helper.make_opsetid("", 16), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8), x_shape, w_shape


@pytest.mark.parametrize(
    "group,attrs,bias",
    [
        (8, dict(pads=[4, 4]), False),  # depthwise, "same" length: ConvBERT's SeparableConv1D
        (4, dict(pads=[1, 2], strides=[2], dilations=[2]), True),
        (2, dict(), True),
    ],
    ids=["depthwise", "strided-dilated-with-bias", "unpadded"],
)
def test_grouped_1d_conv_gradient_runs_as_2d_with_torchs_values(group, attrs, bias):
    # ORT's 1-D ConvGrad with groups writes past its dX output (cpu_kernel_swaps' docstring); the
    # 2-D form over [N, C, 1, L] clears only its own group's channels.
    import torch

    outputs = ("dx", "dw", "db") if bias else ("dx", "dw")
    model, x_shape, w_shape = _conv_grad_model([13], [9 if group == 8 else 3], group, outputs=outputs, **attrs)
    assert swap_kernels(model.graph) == {"ConvGrad": 1}
    assert [n.op_type for n in model.graph.node] == ["Constant", *["Unsqueeze"] * 3, "ConvGrad", "Squeeze", "Squeeze"]
    assert [
        len(a.ints)
        for n in model.graph.node
        if n.op_type == "ConvGrad"
        for a in n.attribute
        if a.name == "kernel_shape"
    ] == [2]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g, requires_grad=True)
    w = torch.randn(w_shape, generator=g, requires_grad=True)
    b = torch.zeros(w_shape[0], requires_grad=True)
    pads = attrs.get("pads", [0, 0])
    x_in = torch.nn.functional.pad(x, pads)  # torch's conv1d pads both ends alike; ONNX's need not
    y = torch.nn.functional.conv1d(
        x_in, w, b, stride=attrs.get("strides", [1])[0], dilation=attrs.get("dilations", [1])[0], groups=group
    )
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    got = _run(model, {"dy": dy.numpy(), "x": x.detach().numpy(), "w": w.detach().numpy()})
    for value, want in zip(got, (x.grad, w.grad, b.grad)):
        np.testing.assert_allclose(value, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "spatial,kernel,group", [([13], [3], 1), ([5, 6], [3, 3], 4)], ids=["ungrouped-1d", "grouped-2d"]
)
def test_conv_gradients_ort_computes_right_stay_with_ort(spatial, kernel, group):
    model, _, _ = _conv_grad_model(spatial, kernel, group)
    assert swap_kernels(model.graph) == {}


def test_a_grouped_1d_conv_gradient_without_dx_stays_with_ort():
    model, _, _ = _conv_grad_model([13], [3], 8, outputs=("", "dw"))
    assert swap_kernels(model.graph) == {}


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_a_conv_gradient_with_same_auto_pad_is_refused(auto_pad):
    # ORT's CPU ConvGrad reads pads only: it would return the gradients of an unpadded convolution.
    model, _, _ = _conv_grad_model([13], [3], 1, auto_pad=auto_pad)
    with pytest.raises(NotImplementedError, match="ignores auto_pad"):
        swap_kernels(model.graph)


def test_a_grouped_3d_conv_gradient_is_refused():
    model, _, _ = _conv_grad_model([3, 4, 5], [1, 3, 3], 8)
    with pytest.raises(NotImplementedError, match="3-D kernel"):
        swap_kernels(model.graph)


def _gemm_model(with_c: bool = False):
    # what ORT's gradient of a 2-D MatMul emits for a weight: X^T dY, summed over a dynamic count of rows
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 5]),
        helper.make_tensor_value_info("dy", TensorProto.FLOAT, ["rows", 3]),
    ]
    if with_c:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [5, 3]))
    node = helper.make_node("Gemm", ["x", "dy"] + (["c"] if with_c else []), ["dw"], name="gemm", transA=1, alpha=0.5)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("dw", TensorProto.FLOAT, [5, 3])])
    opsets = [helper.make_opsetid("", 16), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize("rows", [7, 0])
def test_a_gemm_sums_over_no_rows_once_swapped(rows):
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((rows, 5)).astype(np.float32),
        "dy": rng.standard_normal((rows, 3)).astype(np.float32),
    }
    model = _gemm_model()
    if rows:
        expected = _run(model, feeds)[0]
    else:  # ORT's own Gemm refuses it (gemm_helper.h: K_ > 0): an expert that got no token stopped training
        with pytest.raises(Exception, match="K_ > 0"):
            _run(model, feeds)
        expected = np.zeros((5, 3), np.float32)  # what torch computes
    assert swap_kernels(model.graph) == {"Gemm": 1}
    assert ("FusedMatMul", "com.microsoft") in [(n.op_type, n.domain) for n in model.graph.node]
    for _ in range(20):  # FusedMatMul alone leaves an empty sum's output unwritten: whatever the buffer held
        np.testing.assert_array_equal(_run(model, feeds)[0], expected)  # the same MLAS sgemm: bit-equal


def test_a_gemm_with_c_stays_with_ort():
    model = _gemm_model(with_c=True)
    assert swap_kernels(model.graph) == {}


def _gather_grad_model(label_rows: bool = True, dtype=TensorProto.FLOAT):
    """ORT's label sparsity: the labelled rows' indices (NonZero, Squeeze), ShrunkenGather of them,
    and GatherGrad scattering their gradient back; ``label_rows=False``: the indices are an input."""
    rows, hidden = 24, 8
    nodes = [
        helper.make_node("NonZero", ["labelled"], ["nonzero"]),
        helper.make_node("Squeeze", ["nonzero", "axis0"], ["kept"]),
        helper.make_node("ShrunkenGather", ["x", "kept"], ["x_kept"], domain="com.microsoft", axis=0),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node(
            "GatherGrad", ["x_shape", "kept" if label_rows else "other", "dy"], ["dx"], domain="com.microsoft"
        ),
    ]
    inputs = [
        helper.make_tensor_value_info("x", dtype, [rows, hidden]),
        helper.make_tensor_value_info("labelled", TensorProto.BOOL, [rows]),
        helper.make_tensor_value_info("dy", dtype, ["n", hidden]),
    ]
    if not label_rows:
        inputs.append(helper.make_tensor_value_info("other", TensorProto.INT64, ["n"]))
    outputs = [helper.make_tensor_value_info(name, dtype, None) for name in ("dx", "x_kept")]
    axis = helper.make_tensor("axis0", TensorProto.INT64, [1], [0])
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, [axis]),
        opset_imports=[
            helper.make_opsetid("", 16),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid("org.pytorch.aten", 1),
        ],
        ir_version=8,
    )


@pytest.mark.parametrize("labelled", [7, 0, 24], ids=["some", "none", "every"])
def test_label_sparsity_gather_gradient_runs_on_pytorchs_kernel_with_orts_values(aten_nodes_run, labelled):
    rng = np.random.default_rng(0)
    mask = np.zeros(24, dtype=bool)
    mask[rng.permutation(24)[:labelled]] = True
    feeds = {
        "x": rng.standard_normal((24, 8)).astype(np.float32),
        "labelled": mask,
        "dy": rng.standard_normal((labelled, 8)).astype(np.float32),
    }
    model = _gather_grad_model()
    expected = _run(model, feeds)
    assert swap_kernels(model.graph) == {"GatherGrad": 1}
    assert "GatherGrad" not in [n.op_type for n in model.graph.node]
    got = _run(model, feeds)
    np.testing.assert_array_equal(got[0], expected[0])  # each row a row of dy or zeros: the same bits
    want = np.zeros((24, 8), dtype=np.float32)
    want[np.flatnonzero(mask)] = feeds["dy"]
    np.testing.assert_array_equal(got[0], want)


def test_a_gather_gradient_of_other_indices_or_precision_stays_with_ort(aten_nodes_run):
    assert swap_kernels(_gather_grad_model(label_rows=False).graph) == {}  # indices may repeat: ORT's sums
    assert swap_kernels(_gather_grad_model(dtype=TensorProto.DOUBLE).graph) == {}
    assert swap_kernels(_gather_grad_model().graph, swaps=frozenset({"gemm"})) == {}  # switched off
