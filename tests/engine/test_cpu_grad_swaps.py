"""engine/cpu_grad_swaps.py: ORT's LayerNorm, RMSNorm, softmax and ReLU gradients, swapped for
PyTorch's kernel or ort_hf's, give ORT's kernels' values (and float64's within float32 rounding);
what they cannot take stays with ORT; tiny Llama, BERT, T5 and GPT-2 (with its tanh GELU's gradient)
train through ORT with them swapped, the same loss and gradients as in PyTorch."""

import copy

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from tiny_models import EXTRA_FAMILIES, FAMILIES, build, make_batch

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.engine.cpu_kernel_swaps import swap_kernels
from ort_hf.module_with_loss import ModuleWithLoss

KERNELS = {  # ORT's kernel -> the operator of the ATen node in its place
    "LayerNormalizationGrad": b"native_layer_norm_backward",
    "SimplifiedLayerNormalizationGrad": b"ort_hf::rms_norm_backward",
    "SoftmaxGrad_13": b"ort_hf::softmax_backward",
    "ReluGrad": b"ort_hf::relu_backward",
    "FastGeluGrad": b"ort_hf::gelu_tanh_backward",  # cpu_kernel_swaps.py: GPT-2's gelu_new
}


def _model(op_type: str, inputs: list, outputs: list[str], dtype=TensorProto.FLOAT, **attrs):
    node = helper.make_node(op_type, [name for name, _ in inputs], outputs, domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(name, dtype, shape) for name, shape in inputs],
        [helper.make_tensor_value_info(name, dtype, None) for name in outputs if name],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in (("", 17), ("com.microsoft", 1), ("org.pytorch.aten", 1))]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _run(model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _norm_feeds(shape, rms: bool, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float64)
    mean = np.zeros(shape[:-1] + (1,)) if rms else x.mean(-1, keepdims=True)
    inv_std = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
    feeds = {"dy": rng.standard_normal(shape), "x": x, "w": rng.standard_normal(shape[-1]) + 1, "inv_std": inv_std}
    if not rms:
        feeds["mean"] = mean
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def _norm_truth(feeds, rms: bool):
    """dx, dw, db in float64: autograd of the normalisation (eps 1e-6, as ``_norm_feeds`` saved it)."""
    x, w = (torch.tensor(feeds[k], dtype=torch.float64, requires_grad=True) for k in ("x", "w"))
    b = torch.zeros_like(w, requires_grad=True)
    if rms:
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w + b
    else:
        y = torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps=1e-6)
    y.backward(torch.tensor(feeds["dy"], dtype=torch.float64))
    return [t.grad.numpy() for t in (x, w, b)]


@pytest.mark.parametrize("shape", [(3, 70, 48), (130, 45)], ids=["3d", "tail-and-blocks"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_norm_gradient_swapped_gives_orts_values(aten_nodes_run, shape, rms):
    feeds = _norm_feeds(shape, rms)
    op_type = "SimplifiedLayerNormalizationGrad" if rms else "LayerNormalizationGrad"
    names = ["dy", "x", "w"] + ([] if rms else ["mean"]) + ["inv_std"]
    shapes = {"dy": list(shape), "x": list(shape), "w": [shape[-1]], "mean": list(shape[:-1]) + [1]}
    shapes["inv_std"] = shapes["mean"]
    outputs = ["dx", "dw"] + ([] if rms else ["db"])
    model = _model(op_type, [(n, shapes[n]) for n in names], outputs, axis=-1)
    expected = _run(model, feeds)
    assert swap_kernels(model.graph) == {op_type: 1}
    assert ("ATen", "org.pytorch.aten") in [(n.op_type, n.domain) for n in model.graph.node]
    got = _run(model, feeds)
    truth = _norm_truth(feeds, rms)
    for name, value, ort_value, want in zip(outputs, got, expected, truth):
        np.testing.assert_allclose(value, ort_value, rtol=1e-4, atol=2e-5, err_msg=name)
        # both float32 kernels are as close to float64 (the sums over rows and the row's elements)
        scale = np.abs(want).max()
        for float32 in (value, ort_value):
            np.testing.assert_allclose(float32, want, rtol=0, atol=2e-6 * scale, err_msg=name)


@pytest.mark.parametrize("shape", [(2, 3, 17, 17), (5, 40)])
def test_softmax_gradient_swapped_gives_orts_values(aten_nodes_run, shape):
    rng = np.random.default_rng(0)
    y = torch.softmax(torch.tensor(rng.standard_normal(shape) * 3), -1)
    feeds = {"dy": rng.standard_normal(shape).astype(np.float32), "y": y.numpy().astype(np.float32)}
    model = _model("SoftmaxGrad_13", [("dy", list(shape)), ("y", list(shape))], ["dx"], axis=-1)
    expected = _run(model, feeds)[0]
    assert swap_kernels(model.graph) == {"SoftmaxGrad_13": 1}
    assert model.graph.node[-1].attribute[0].s == b"ort_hf::softmax_backward"
    got = _run(model, feeds)[0]
    dy, y64 = torch.tensor(feeds["dy"], dtype=torch.float64), torch.tensor(feeds["y"], dtype=torch.float64)
    truth = (y64 * (dy - (dy * y64).sum(-1, keepdim=True))).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op_type,inputs,attrs,dtype",
    [
        ("SoftmaxGrad_13", ["dy", "y"], {"axis": 1}, TensorProto.FLOAT),
        ("SoftmaxGrad_13", ["dy", "y"], {}, TensorProto.DOUBLE),
        ("LayerNormalizationGrad", ["dy", "x", "w", "mean", "inv_std"], {"axis": 1}, TensorProto.FLOAT),
        ("SimplifiedLayerNormalizationGrad", ["dy", "x", "w", "inv_std"], {}, TensorProto.DOUBLE),
    ],
    ids=["softmax-axis-1", "softmax-float64", "layer-norm-axis-1", "rms-norm-float64"],
)
def test_other_axes_and_precisions_stay_with_ort(aten_nodes_run, op_type, inputs, attrs, dtype):
    outputs = ["dx"] if op_type == "SoftmaxGrad_13" else ["dx", "dw"]
    model = _model(op_type, [(name, None) for name in inputs], outputs, dtype=dtype, **attrs)
    assert swap_kernels(model.graph) == {}


def test_relu_gradient_swapped_gives_orts_values(aten_nodes_run):
    rng = np.random.default_rng(0)
    feeds = {
        "dy": rng.standard_normal((33, 48)).astype(np.float32),
        "x": rng.standard_normal((33, 48)).astype(np.float32),
    }
    feeds["x"][0, :5] = 0.0  # ReLU's kink: no gradient at 0, in both
    model = _model("ReluGrad", [("dy", [33, 48]), ("x", [33, 48])], ["dx"])
    expected = _run(model, feeds)[0]
    assert swap_kernels(model.graph) == {"ReluGrad": 1}
    np.testing.assert_array_equal(_run(model, feeds)[0], expected)  # a selection: bit-equal
    np.testing.assert_array_equal(expected, np.where(feeds["x"] > 0, feeds["dy"], 0))


def test_relu_gradient_at_a_nan_activation_passes_the_gradient_as_eager_does(aten_nodes_run):
    """ORT's kernel gives 0 there; the swap (on by default) gives what eager PyTorch's ReLU does."""
    before = torch.tensor([float("nan"), -1.0, 0.0, 1.0], requires_grad=True)
    dy = torch.tensor([1.0, 2.0, 3.0, 4.0])
    after = torch.relu(before)
    after.backward(dy)
    feeds = {"dy": dy.numpy()[None], "x": after.detach().numpy()[None]}
    model = _model("ReluGrad", [("dy", [1, 4]), ("x", [1, 4])], ["dx"])
    np.testing.assert_array_equal(_run(model, feeds)[0], [[0.0, 0.0, 0.0, 4.0]])  # ORT's own
    assert swap_kernels(model.graph) == {"ReluGrad": 1}
    np.testing.assert_array_equal(_run(model, feeds)[0], before.grad.numpy()[None])  # [1, 0, 0, 4]


@pytest.mark.parametrize(
    "family,expected",
    [
        ("llama-clm", {"SimplifiedLayerNormalizationGrad", "SoftmaxGrad_13"}),
        ("bert-cls", {"LayerNormalizationGrad", "SoftmaxGrad_13"}),
        ("t5-s2s", {"SimplifiedLayerNormalizationGrad", "SoftmaxGrad_13", "ReluGrad"}),
        ("gpt2-clm", {"LayerNormalizationGrad", "SoftmaxGrad_13", "FastGeluGrad"}),
    ],
)
def test_tiny_model_trains_with_its_gradients_swapped(family, expected):
    spec = {**FAMILIES, **EXTRA_FAMILIES}[family]
    model = build(spec)
    reference = copy.deepcopy(model)
    options = ORTOptions(fallback="disable", log_level="ERROR", cpu_softmax_grad_swap=True, cpu_relu_grad_swap=True)
    engine = wrap_model(ModuleWithLoss(model), options)
    engine.train()
    batch = make_batch(spec.task, torch.Generator().manual_seed(1))
    own = reference(**batch).loss
    own.backward()
    got = engine(**batch)["loss"]
    got.backward()
    assert engine.engine_status().backend == "ort"
    torch.testing.assert_close(got.detach(), own.detach(), rtol=1e-5, atol=1e-6)
    for (name, ref), param in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(param.grad, ref.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    swapped = {op: count for op, count in engine._record.swapped.items() if op in KERNELS}
    assert set(swapped) == expected
    graph = engine.training_graph().graph
    assert not [n for n in graph.node if n.op_type in KERNELS]  # none left with ORT
    operators = [a.s for n in graph.node if n.op_type == "ATen" for a in n.attribute if a.name == "operator"]
    for op, count in swapped.items():
        assert operators.count(KERNELS[op]) == count, op


def test_a_large_softmax_gradient_reuses_a_released_buffer(aten_nodes_run):
    # 32 MiB and more: written into a kept buffer once nothing holds it (csrc/cpu_softmax_grad.cpp)
    from ort_hf.engine.cpu_kernel_swaps import release_kernel_buffers

    g = torch.Generator().manual_seed(0)
    y = torch.softmax(torch.randn(2, 4, 1024, 1024, generator=g), -1)
    dy = torch.randn(y.shape, generator=g)
    want = torch.ops.aten._softmax_backward_data(dy, y, -1, torch.float32)
    first = torch.ops.ort_hf.softmax_backward(dy, y, -1)
    held = torch.ops.ort_hf.softmax_backward(dy, y, -1)  # the first is held: a buffer of its own
    assert held.data_ptr() != first.data_ptr()
    kept = first.data_ptr()
    first.fill_(float("nan"))
    del first
    other = torch.empty(y.shape)  # would get the freed block, were it not kept
    assert other.data_ptr() != kept
    again = torch.ops.ort_hf.softmax_backward(dy, y, -1)
    assert again.data_ptr() == kept
    for got in (held, again):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    release_kernel_buffers()


def test_an_rms_norm_gradient_from_1_mib_reuses_a_released_buffer(aten_nodes_run):
    # 1 MiB and more: written into a kept buffer once nothing holds it (csrc/cpu_rms_norm_grad.cpp)
    from ort_hf.engine.cpu_kernel_swaps import release_kernel_buffers

    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(1024, 576, generator=g), torch.randn(1024, 576, generator=g)
    w, rstd = torch.randn(576, generator=g), torch.rand(1024, 1, generator=g) + 0.5
    want = torch.ops.ort_hf.rms_norm_backward(dy, x, w, rstd)  # a buffer of its own, held here
    first, _ = torch.ops.ort_hf.rms_norm_backward(dy, x, w, rstd)
    kept = first.data_ptr()
    assert kept != want[0].data_ptr()
    first.fill_(float("nan"))
    del first
    other = torch.empty(x.shape)  # would get the freed block, were it not kept
    assert other.data_ptr() != kept
    again, dw = torch.ops.ort_hf.rms_norm_backward(dy, x, w, rstd)
    assert again.data_ptr() == kept
    torch.testing.assert_close(again, want[0], rtol=0, atol=0)
    torch.testing.assert_close(dw, want[1], rtol=0, atol=0)
    expected_dx = rstd * w * dy - x * rstd**3 * (dy * w * x).sum(-1, keepdim=True) / 576
    torch.testing.assert_close(again, expected_dx, rtol=1e-5, atol=1e-5)
    release_kernel_buffers()
