"""engine/cpu_weight_grad.py: a linear weight's gradient (ORT's Gemm then Transpose) runs as
PyTorch's matrix product with ORT's values, over no rows as zeros; what it does not take stays
ORT's; tiny causal LMs (untied Llama, tied GPT-2) with a vocabulary-sized head, and a Llama whose
layers are wide enough too, train through ORT with them swapped, the same losses and gradients as
in PyTorch."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from parity import assert_parity, run_parity
from tiny_models import FAMILIES, make_batch

from ort_hf.engine import ORTOptions
from ort_hf.engine.cpu_weight_grad import MIN_COLS, MIN_ROWS, OPERATOR, large_enough, swap_weight_grads

HIDDEN = MIN_COLS
VOCAB_ROWS = 8192


def _model(
    out_rows: int,
    hidden: int = HIDDEN,
    c_input: bool = False,
    alpha: float = 1.0,
    also_read: bool = False,
    dtype=TensorProto.FLOAT,
):
    """x (rows, hidden), dy (rows, out_rows) -> Gemm(x, dy, transA=1) -> Transpose -> dw (out_rows, hidden)."""
    inputs = ["x", "dy"] + (["c"] if c_input else [])
    nodes = [
        helper.make_node("Gemm", inputs, ["dw_t"], name="grad/Gemm", transA=1, alpha=alpha),
        helper.make_node("Transpose", ["dw_t"], ["dw"], name="grad/Transpose", perm=[1, 0]),
    ]
    outputs = [helper.make_tensor_value_info("dw", dtype, [out_rows, hidden])]
    if also_read:
        nodes.append(helper.make_node("Identity", ["dw_t"], ["dw_t_copy"]))
        outputs.append(helper.make_tensor_value_info("dw_t_copy", dtype, [hidden, out_rows]))
    graph_inputs = [
        helper.make_tensor_value_info("x", dtype, ["rows", hidden]),
        helper.make_tensor_value_info("dy", dtype, ["rows", out_rows]),
    ]
    if c_input:
        graph_inputs.append(helper.make_tensor_value_info("c", dtype, [hidden, out_rows]))
    graph = helper.make_graph(nodes, "g", graph_inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("org.pytorch.aten", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _run(model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("rows", [37, 0])
def test_a_vocabulary_sized_weight_gradient_runs_on_pytorchs_product(aten_nodes_run, rows):
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((rows, HIDDEN)).astype(np.float32),
        "dy": rng.standard_normal((rows, VOCAB_ROWS)).astype(np.float32),
    }
    model = _model(VOCAB_ROWS)
    truth = feeds["dy"].astype(np.float64).T @ feeds["x"].astype(np.float64)
    if rows:
        expected = _run(model, feeds)[0]
        np.testing.assert_allclose(expected, truth, rtol=1e-5, atol=1e-5)
    assert swap_weight_grads(model.graph, threads=2) == 1
    assert [n.op_type for n in model.graph.node] == ["Constant", "ATen"]
    got = _run(model, feeds)[0]
    assert got.shape == (VOCAB_ROWS, HIDDEN)
    np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-5)  # ORT's Gemm refuses an empty sum; zeros here


@pytest.mark.parametrize(
    "kwargs",
    [
        {"out_rows": MIN_ROWS - 1},  # a LoRA factor's rank: too small a product to gain
        {"out_rows": VOCAB_ROWS, "hidden": MIN_COLS - 1},
        {"out_rows": VOCAB_ROWS, "c_input": True},
        {"out_rows": VOCAB_ROWS, "alpha": 0.5},
        {"out_rows": VOCAB_ROWS, "also_read": True},  # the untransposed sum is read too
        {"out_rows": VOCAB_ROWS, "dtype": TensorProto.DOUBLE},
    ],
    ids=["few-rows", "few-columns", "with-c", "alpha", "read-twice", "float64"],
)
def test_what_it_does_not_take_stays_with_ort(kwargs):
    model = _model(**kwargs)
    before = [n.op_type for n in model.graph.node]
    assert swap_weight_grads(model.graph, threads=2) == 0
    assert [n.op_type for n in model.graph.node] == before


@pytest.mark.parametrize("cut_rows", [True, False], ids=["its-input-rows-cut", "elsewhere"])
def test_a_weight_whose_rows_label_sparsity_cut_stays_with_ort(cut_rows):
    """ORT's ShrunkenGather keeps the labelled rows; a weight gradient summing over its output stays
    ORT's, one over rows it did not cut moves."""
    model = _model(VOCAB_ROWS)
    graph = model.graph
    gather = helper.make_node("ShrunkenGather", ["all_x", "kept"], ["x_cut"], domain="com.microsoft")
    graph.node.insert(0, gather)
    if cut_rows:  # x is computed from the gather's output
        graph.node.insert(1, helper.make_node("Identity", ["x_cut"], ["x"]))
    before = [n.op_type for n in graph.node]
    assert swap_weight_grads(graph, threads=2) == int(not cut_rows)
    if cut_rows:
        assert [n.op_type for n in graph.node] == before


def _vocab_sized(family: str):
    """The family's tiny LM with a vocabulary-sized head, MIN_COLS wide: the head's gradient and the
    layers' square projections (Llama's q and o; GPT-2's are Conv1D) are large enough to move."""
    spec = FAMILIES[family]
    config = spec.make_config(0.0, "eager")
    config.vocab_size = VOCAB_ROWS
    config.hidden_size = MIN_COLS
    if hasattr(config, "head_dim"):  # Llama's, set from the width it was built with
        config.head_dim = MIN_COLS // config.num_attention_heads
    torch.manual_seed(0)
    return spec.model_cls(config).train()


def _large_enough_linears(model) -> int:
    return sum(isinstance(m, torch.nn.Linear) and large_enough(*m.weight.shape) for m in model.modules())


@pytest.mark.parametrize("family", ["llama-clm", "gpt2-clm"])
@pytest.mark.parametrize("switch", [True, False], ids=["swapped", "switched-off"])
def test_a_tiny_lm_with_a_vocabulary_sized_head_trains_with_it(family, switch):
    generator = torch.Generator().manual_seed(1)
    batches = [make_batch("clm", generator) for _ in range(2)]
    options = ORTOptions(fallback="disable", log_level="ERROR", cpu_weight_grad_swap=switch)
    model = _vocab_sized(family)
    large = _large_enough_linears(model)
    assert large == (5 if family == "llama-clm" else 1)  # the head; Llama's q and o in each of 2 layers
    moved = large if switch else 0
    *results, wrapped = run_parity(model, batches, options)
    assert_parity(*results, wrapped, loss_atol=1e-5)
    graph = wrapped.training_graph().graph
    operators = [a.s for n in graph.node if n.op_type == "ATen" for a in n.attribute if a.name == "operator"]
    assert operators.count(OPERATOR.encode()) == moved
    assert wrapped._record.swapped.get("Gemm (weight gradient)", 0) == moved
