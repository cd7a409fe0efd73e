"""engine/cpu_linear_products.py: a linear layer's forward product and its input's gradient run as
PyTorch's matrix product with ORT's values, the weight's Transpose gone once nothing else reads it;
what it does not take stays ORT's; GPT-2's Conv1D likewise; by default only on Intel CPUs; a tiny
Llama and a tiny GPT-2 train through ORT with them swapped, the same losses and gradients as in
PyTorch."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from parity import assert_parity, run_parity
from tiny_models import make_batch

from ort_hf.engine import ORTOptions
from ort_hf.engine import cpu_linear_products as products
from ort_hf.engine.options import LINEAR_PRODUCT_MIN_DIM, WEIGHT_GRAD_MIN_DIM
from ort_hf.engine.swap_switches import wanted_swaps
from ort_hf.engine.wrap_settings import rewrites_line

OUT, IN = LINEAR_PRODUCT_MIN_DIM, LINEAR_PRODUCT_MIN_DIM + 8
OPSETS = [
    helper.make_opsetid("", 17),
    helper.make_opsetid("com.microsoft", 1),
    helper.make_opsetid("org.pytorch.aten", 1),
]


def _model(
    out: int = OUT,
    grad_op: str = "FusedMatMul",
    grad_attrs: dict | None = None,
    dtype=TensorProto.FLOAT,
    also_read: bool = False,
):
    """w (out x in) -> Transpose -> MatMul(x, w^T) = y, and the input's gradient dy w as ``grad_op``
    (ORT's FusedMatMul of 3-D operands, or a Gemm of 2-D ones) = dx; ``also_read``: an Identity
    reads the transposed weight too."""
    ms = grad_op == "FusedMatMul"
    rank = ["batch", "rows"] if ms else ["rows"]
    attrs = {"transB": 1, **(grad_attrs or {})}
    nodes = [
        helper.make_node("Transpose", ["w"], ["w_t"], name="w/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w_t"], ["y"], name="forward/MatMul"),
        helper.make_node(grad_op, ["dy", "w_t"], ["dx"], name="grad", domain="com.microsoft" if ms else "", **attrs),
    ]
    outputs = [
        helper.make_tensor_value_info("y", dtype, [*rank, out]),
        helper.make_tensor_value_info("dx", dtype, None),
    ]
    if also_read:
        nodes.append(helper.make_node("Identity", ["w_t"], ["w_t_copy"]))
        outputs.append(helper.make_tensor_value_info("w_t_copy", dtype, [IN, out]))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", dtype, [*rank, IN]),
            helper.make_tensor_value_info("w", dtype, [out, IN]),
            helper.make_tensor_value_info("dy", dtype, [*rank, out]),
        ],
        outputs,
    )
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


def _conv1d_model(grad_op: str = "Gemm", forward_attrs: dict | None = None, grad_attrs: dict | None = None):
    """GPT-2's Conv1D as ORT's graph has it: w (in x out), Gemm(x, w, b) = y, and the input's
    gradient dy w^T as ``grad_op`` (a Gemm of 2-D operands, or ORT's FusedMatMul of 3-D ones) = dx."""
    ms = grad_op == "FusedMatMul"
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="forward", **(forward_attrs or {})),
        helper.make_node(
            grad_op,
            ["dy", "w"],
            ["dx"],
            name="grad",
            domain="com.microsoft" if ms else "",
            **{"transB": 1, **(grad_attrs or {})},
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", IN]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [IN, OUT]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [OUT]),
            helper.make_tensor_value_info("dy", TensorProto.FLOAT, [*(["batch"] if ms else []), "rows", OUT]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("dx", TensorProto.FLOAT, None),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=8)


def _keys(*operators: str) -> dict[str, int]:
    return {products.KEYS[operator]: 1 for operator in operators}


def _run(model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(grad_op: str, rows: int = 37):
    rng = np.random.default_rng(0)
    lead = (2, rows) if grad_op == "FusedMatMul" else (rows,)
    return {
        "x": rng.standard_normal((*lead, IN)).astype(np.float32),
        "w": rng.standard_normal((OUT, IN)).astype(np.float32),
        "dy": rng.standard_normal((*lead, OUT)).astype(np.float32),
    }


@pytest.mark.parametrize("grad_op", ["FusedMatMul", "Gemm"])
@pytest.mark.parametrize("also_read", [False, True], ids=["transpose-dropped", "transpose-kept"])
def test_the_products_run_on_pytorchs_matmul(aten_nodes_run, grad_op, also_read):
    feeds = _feeds(grad_op)
    model = _model(grad_op=grad_op, also_read=also_read)
    x, w, dy = (feeds[k].astype(np.float64) for k in ("x", "w", "dy"))
    truths = [x @ w.T, dy @ w] + ([w.T] if also_read else [])
    for expected, truth in zip(_run(model, feeds), truths):
        np.testing.assert_allclose(expected, truth, rtol=1e-5, atol=1e-4)
    moved = products.swap_linear_products(model.graph, threads=2)
    assert moved == _keys(products.FORWARD, products.INPUT_GRAD)
    kept = ["Transpose", "Identity"] if also_read else []
    assert sorted(n.op_type for n in model.graph.node) == sorted(["Constant", "ATen", "ATen", *kept])
    for got, truth in zip(_run(model, feeds), truths):
        assert got.shape == truth.shape
        np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, forward_moves",
    [
        ({"out": LINEAR_PRODUCT_MIN_DIM - 1}, False),  # a smaller layer's: measured no faster
        ({"dtype": TensorProto.DOUBLE}, False),
        ({"grad_attrs": {"alpha": 0.5}}, True),
        ({"grad_attrs": {"transA": 1}}, True),
        ({"grad_attrs": {"transBatchA": 1}}, True),
        ({"grad_op": "Gemm", "grad_attrs": {"transB": 0}}, True),
    ],
    ids=["small-weight", "float64", "alpha", "transposed-dy", "batch-transposed", "untransposed-gemm"],
)
def test_what_it_does_not_take_stays_with_ort(kwargs, forward_moves):
    model = _model(**kwargs)
    grad = next(n for n in model.graph.node if n.name == "grad")
    moved = products.swap_linear_products(model.graph, threads=2)
    assert moved == (_keys(products.FORWARD) if forward_moves else {})
    assert grad in model.graph.node  # the gradient node is ORT's, as it was
    assert any(n.op_type == "Transpose" for n in model.graph.node)  # still read by that node


@pytest.mark.parametrize("grad_op", ["Gemm", "FusedMatMul"])
def test_conv1d_products_run_on_pytorchs_matmul(aten_nodes_run, grad_op):
    rng = np.random.default_rng(0)
    lead = (2, 37) if grad_op == "FusedMatMul" else (37,)
    feeds = {
        "x": rng.standard_normal((37, IN)).astype(np.float32),
        "w": rng.standard_normal((IN, OUT)).astype(np.float32),
        "b": rng.standard_normal(OUT).astype(np.float32),
        "dy": rng.standard_normal((*lead, OUT)).astype(np.float32),
    }
    x, w, b, dy = (feeds[k].astype(np.float64) for k in ("x", "w", "b", "dy"))
    truths = [b + x @ w, dy @ w.T]
    model = _conv1d_model(grad_op)
    moved = products.swap_linear_products(model.graph, threads=2)
    assert moved == _keys(products.CONV1D_FORWARD, products.CONV1D_INPUT_GRAD)
    assert sorted(n.op_type for n in model.graph.node) == ["ATen", "ATen", "Constant"]
    for got, truth in zip(_run(model, feeds), truths):
        assert got.shape == truth.shape
        np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "forward_attrs, grad_attrs",
    [({"beta": 0.5}, {"alpha": 0.5}), ({"transA": 1}, {"transA": 1}), ({"transB": 1}, {"transB": 0})],
    ids=["scaled", "transposed-input", "other-transposition"],
)
def test_other_conv1d_like_products_stay_with_ort(forward_attrs, grad_attrs):
    model = _conv1d_model(forward_attrs=forward_attrs, grad_attrs=grad_attrs)
    assert products.swap_linear_products(model.graph, threads=2) == {}
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Gemm"]


def test_a_lower_bound_moves_smaller_weights():
    model = _model(out=LINEAR_PRODUCT_MIN_DIM - 1)
    moved = products.swap_linear_products(model.graph, threads=2, min_dim=LINEAR_PRODUCT_MIN_DIM - 1)
    assert moved == _keys(products.FORWARD, products.INPUT_GRAD)


@pytest.mark.parametrize(
    "vendor, on",
    [("GenuineIntel", True), ("AuthenticAMD", False), ("", False)],
)
def test_by_default_the_products_move_on_intel_cpus_only(monkeypatch, vendor, on):
    monkeypatch.setattr(products.cpu_head_products, "cpu_vendor", lambda: vendor)
    assert ("linear_product" in wanted_swaps(ORTOptions(), "cpu")) is on
    assert "linear_product" in wanted_swaps(ORTOptions(cpu_linear_product_swap=True), "cpu")
    assert "linear_product" not in wanted_swaps(ORTOptions(cpu_linear_product_swap=False), "cpu")
    assert "linear_product" not in wanted_swaps(ORTOptions(cpu_linear_product_swap=True), "cuda")
    # ORT's recompute plans recompute its own MatMul, not an ATen node: they keep the products ORT's
    assert "linear_product" not in wanted_swaps(ORTOptions(cpu_linear_product_swap=True, memory_opt_level=1), "cpu")
    settings = SimpleNamespace(options=ORTOptions(), device_type="cpu", trim_padding=False, eliminate_padding=False)
    _, line = rewrites_line("Model", settings, wanted_swaps(settings.options, "cpu"))
    kernels_on = line.split("ort_hf's CPU kernels on: ")[1].split(";")[0]
    assert ("linear_product" in kernels_on) is on
    if not on:
        assert "linear_product (not on this CPU; --ort_cpu_linear_product_swap true forces it)" in line


@pytest.mark.parametrize(
    "family, counts",
    [
        # The head and Llama's q and o in 2 layers are large enough (every input's gradient is needed: the
        # embeddings train).
        ("llama-clm", {products.FORWARD: 5, products.INPUT_GRAD: 5}),
        # GPT-2's tied head, and its 4 Conv1D layers in each of 2 blocks.
        (
            "gpt2-clm",
            {products.FORWARD: 1, products.INPUT_GRAD: 1, products.CONV1D_FORWARD: 8, products.CONV1D_INPUT_GRAD: 8},
        ),
    ],
)
@pytest.mark.parametrize("swap", [True, False], ids=["swapped", "switched-off"])
def test_a_tiny_lm_trains_with_them(family, counts, swap):
    from test_cpu_weight_grad import _vocab_sized

    generator = torch.Generator().manual_seed(1)
    batches = [make_batch("clm", generator) for _ in range(2)]
    options = ORTOptions(
        fallback="disable",
        log_level="ERROR",
        cpu_linear_product_swap=swap,
        cpu_linear_product_min_dim=WEIGHT_GRAD_MIN_DIM,  # the tiny models' width
    )
    model = _vocab_sized(family)
    *results, wrapped = run_parity(model, batches, options)
    assert_parity(*results, wrapped, loss_atol=1e-5)
    graph = wrapped.training_graph().graph
    operators = [a.s.decode() for n in graph.node if n.op_type == "ATen" for a in n.attribute if a.name == "operator"]
    assert {op: operators.count(op) for op in products.KEYS} == {
        op: (counts.get(op, 0) if swap else 0) for op in products.KEYS
    }
