"""engine/cpu_weight_grad.py: a linear weight's gradient (ORT's Gemm then Transpose) runs as
PyTorch's matrix product with ORT's values, over no rows as zeros; what it does not take stays
ORT's; tiny causal LMs (untied Llama, tied GPT-2) with a vocabulary-sized head, and a Llama whose
layers are wide enough too, train through ORT with them swapped, the same losses and gradients as
in PyTorch."""

import copy

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from parity import assert_parity, run_parity
from tiny_models import FAMILIES, make_batch
from transformers.pytorch_utils import Conv1D

from ort_hf.engine import ORTOptions, cpu_head_products
from ort_hf.engine.cpu_weight_grad import (
    OPERATOR,
    WEIGHT_GRAD_MIN_DIM,
    large_enough,
    swap_weight_grads,
    weight_grad_wanted,
)
from ort_hf.engine.swap_switches import wanted_swaps

HIDDEN = WEIGHT_GRAD_MIN_DIM
VOCAB_ROWS = 8192


def _model(
    out_rows: int,
    hidden: int = HIDDEN,
    c_input: bool = False,
    alpha: float = 1.0,
    also_read: bool = False,
    dtype=TensorProto.FLOAT,
    transposed: bool = True,
):
    """x (rows, hidden), dy (rows, out_rows) -> Gemm(x, dy, transA=1) -> Transpose -> dw (out_rows, hidden),
    an nn.Linear weight's gradient; not ``transposed``: the Gemm's dw_t (hidden, out_rows), a Conv1D's."""
    inputs = ["x", "dy"] + (["c"] if c_input else [])
    nodes = [helper.make_node("Gemm", inputs, ["dw_t"], name="grad/Gemm", transA=1, alpha=alpha)]
    outputs = []
    if transposed:
        nodes.append(helper.make_node("Transpose", ["dw_t"], ["dw"], name="grad/Transpose", perm=[1, 0]))
        outputs.append(helper.make_tensor_value_info("dw", dtype, [out_rows, hidden]))
    if also_read or not transposed:
        nodes.append(helper.make_node("Identity", ["dw_t"], ["dw_t_copy"]))
        outputs.append(helper.make_tensor_value_info("dw_t_copy", dtype, [hidden, out_rows]))
        graph_values = [helper.make_tensor_value_info("dw_t", dtype, [hidden, out_rows])]  # as ORT infers it
    else:
        graph_values = []
    graph_inputs = [
        helper.make_tensor_value_info("x", dtype, ["rows", hidden]),
        helper.make_tensor_value_info("dy", dtype, ["rows", out_rows]),
    ]
    if c_input:
        graph_inputs.append(helper.make_tensor_value_info("c", dtype, [hidden, out_rows]))
    graph = helper.make_graph(nodes, "g", graph_inputs, outputs, value_info=graph_values)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("org.pytorch.aten", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _run(model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


# The graph's nodes once swapped, by form: the Linear's Gemm and Transpose become one product; the
# Conv1D's Gemm becomes one; a Gemm whose product is also read untransposed becomes one, its
# Transpose kept.
SWAPPED_FORMS = {
    "linear": ({}, ["Constant", "ATen"]),
    "conv1d": ({"transposed": False}, ["Constant", "ATen", "Identity"]),
    "read-twice": ({"also_read": True}, ["Constant", "ATen", "Transpose", "Identity"]),
}


@pytest.mark.parametrize("form", SWAPPED_FORMS)
@pytest.mark.parametrize("rows", [37, 0])
def test_a_vocabulary_sized_weight_gradient_runs_on_pytorchs_product(aten_nodes_run, rows, form):
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((rows, HIDDEN)).astype(np.float32),
        "dy": rng.standard_normal((rows, VOCAB_ROWS)).astype(np.float32),
    }
    kwargs, swapped = SWAPPED_FORMS[form]
    model = _model(VOCAB_ROWS, **kwargs)
    truth_t = feeds["x"].astype(np.float64).T @ feeds["dy"].astype(np.float64)  # the Gemm's product, in x out
    truths = [truth_t.T if o.name == "dw" else truth_t for o in model.graph.output]
    if rows:
        for expected, truth in zip(_run(model, feeds), truths):
            np.testing.assert_allclose(expected, truth, rtol=1e-5, atol=1e-5)
    assert swap_weight_grads(model.graph, threads=2) == 1
    assert [n.op_type for n in model.graph.node] == swapped
    for got, truth in zip(_run(model, feeds), truths):
        assert got.shape == truth.shape
        np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-5)  # ORT's Gemm refuses an empty sum; zeros here


@pytest.mark.parametrize(
    "kwargs",
    [
        {"out_rows": WEIGHT_GRAD_MIN_DIM - 1},  # a LoRA factor's rank: too small a product to gain
        {"out_rows": VOCAB_ROWS, "hidden": WEIGHT_GRAD_MIN_DIM - 1},
        {"out_rows": VOCAB_ROWS, "c_input": True},
        {"out_rows": VOCAB_ROWS, "alpha": 0.5},
        {"out_rows": VOCAB_ROWS, "dtype": TensorProto.DOUBLE},
    ],
    ids=["few-rows", "few-columns", "with-c", "alpha", "float64"],
)
def test_what_it_does_not_take_stays_with_ort(kwargs):
    model = _model(**kwargs)
    before = [n.op_type for n in model.graph.node]
    assert swap_weight_grads(model.graph, threads=2) == 0
    assert [n.op_type for n in model.graph.node] == before


def test_a_lower_bound_moves_smaller_weights():
    model = _model(WEIGHT_GRAD_MIN_DIM - 1)
    assert swap_weight_grads(model.graph, threads=2, min_dim=WEIGHT_GRAD_MIN_DIM - 1) == 1


@pytest.mark.parametrize("cut_rows", [True, False], ids=["its-input-rows-cut", "elsewhere"])
def test_a_weight_whose_rows_label_sparsity_cut_stays_with_ort(cut_rows):
    """ORT's ShrunkenGather keeps the labelled rows; a weight gradient summing over its output stays
    ORT's, one over rows it did not cut moves; asked to (``labelled_rows_too``), both move."""
    model = _model(VOCAB_ROWS)
    graph = model.graph
    gather = helper.make_node("ShrunkenGather", ["all_x", "kept"], ["x_cut"], domain="com.microsoft")
    graph.node.insert(0, gather)
    if cut_rows:  # x is computed from the gather's output
        graph.node.insert(1, helper.make_node("Identity", ["x_cut"], ["x"]))
    before = [n.op_type for n in graph.node]
    again = copy.deepcopy(graph)
    assert swap_weight_grads(graph, threads=2) == int(not cut_rows)
    if cut_rows:
        assert [n.op_type for n in graph.node] == before
    assert swap_weight_grads(again, threads=2, labelled_rows_too=True) == 1


def _vocab_sized(family: str):
    """The family's tiny LM with a vocabulary-sized head, WEIGHT_GRAD_MIN_DIM wide: the head's gradient and the
    layers' projections at least that wide both ways (Llama's q and o; all of GPT-2's) are large enough to move."""
    spec = FAMILIES[family]
    config = spec.make_config(0.0, "eager")
    config.vocab_size = VOCAB_ROWS
    config.hidden_size = WEIGHT_GRAD_MIN_DIM
    if hasattr(config, "head_dim"):  # Llama's, set from the width it was built with
        config.head_dim = WEIGHT_GRAD_MIN_DIM // config.num_attention_heads
    torch.manual_seed(0)
    return spec.model_cls(config).train()


def _large_enough_linears(model, min_dim: int = WEIGHT_GRAD_MIN_DIM) -> int:
    """The model's linear weights (nn.Linear's, out x in, and GPT-2's Conv1D's, in x out) that move."""
    return sum(
        isinstance(m, (torch.nn.Linear, Conv1D)) and large_enough(*m.weight.shape, min_dim) for m in model.modules()
    )


@pytest.mark.parametrize("family", ["llama-clm", "gpt2-clm"])
@pytest.mark.parametrize(
    "switches",
    [
        {"cpu_weight_grad_swap": True},
        {"cpu_weight_grad_swap": False},
        {"cpu_weight_grad_swap": True, "cpu_weight_grad_min_dim": 1},
    ],
    ids=["swapped", "switched-off", "every-size"],
)
def test_a_tiny_lm_with_a_vocabulary_sized_head_trains_with_it(family, switches):
    generator = torch.Generator().manual_seed(1)
    batches = [make_batch("clm", generator) for _ in range(2)]
    options = ORTOptions(fallback="disable", log_level="ERROR", **switches)
    model = _vocab_sized(family)
    # The head; Llama's q and o in 2 layers, GPT-2's 4 Conv1D; all 7 projections of Llama's layers.
    assert _large_enough_linears(model) == (5 if family == "llama-clm" else 9)
    assert _large_enough_linears(model, 1) == (15 if family == "llama-clm" else 9)
    moved = _large_enough_linears(model, options.cpu_weight_grad_min_dim) if options.cpu_weight_grad_swap else 0
    *results, wrapped = run_parity(model, batches, options)
    assert_parity(*results, wrapped, loss_atol=1e-5)
    graph = wrapped.training_graph().graph
    operators = [a.s for n in graph.node if n.op_type == "ATen" for a in n.attribute if a.name == "operator"]
    assert operators.count(OPERATOR.encode()) == moved
    assert wrapped._record.swapped.get("Gemm (weight gradient)", 0) == moved


def test_a_vocabulary_sized_gradient_reuses_a_released_buffer_never_a_held_one(aten_nodes_run):
    """csrc/cpu_weight_grad.cpp with kept_buffers.h: a gradient of 32 MB or more is written into a
    buffer kept from an earlier call once nothing holds it (the optimizer step released the last
    step's), of any shape of its size; never into one still held; the same sums."""
    g = torch.Generator().manual_seed(0)
    vocab = 30_522  # BERT's: 47 MB of gradient at 384 wide
    x, dy = torch.randn(64, 384, generator=g), torch.randn(64, vocab, generator=g)
    held = torch.ops.ort_hf.weight_grad(dy, x, 2)  # vocab x 384: an nn.Linear head's
    released = torch.ops.ort_hf.weight_grad(dy, x, 2)
    address = released.data_ptr()
    assert address != held.data_ptr() and released.nbytes >= 32 << 20
    del released
    again = torch.ops.ort_hf.weight_grad(x, dy, 2)  # 384 x vocab: a Conv1D head's, the same size
    assert again.data_ptr() == address
    torch.testing.assert_close(again, torch.mm(x.t(), dy), rtol=0, atol=0)
    torch.testing.assert_close(held, torch.mm(dy.t(), x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "vendor, capability, on",
    [
        ("GenuineIntel", "AVX512", True),
        ("AuthenticAMD", "AVX2", True),
        ("AuthenticAMD", "AVX512", False),  # ORT's Gemm measured faster there (cpu_weight_grad.py)
        ("", "DEFAULT", True),
    ],
)
def test_by_default_the_weight_gradients_move_except_on_amd_cpus_with_avx512(monkeypatch, vendor, capability, on):
    assert weight_grad_wanted(None, vendor, capability) is on
    assert weight_grad_wanted(True, "AuthenticAMD", "AVX512") and not weight_grad_wanted(False, "GenuineIntel", "AVX2")
    monkeypatch.setattr(cpu_head_products, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert ("weight_grad" in wanted_swaps(ORTOptions(), "cpu")) is on
    assert "weight_grad" in wanted_swaps(ORTOptions(cpu_weight_grad_swap=True), "cpu")
    assert "weight_grad" not in wanted_swaps(ORTOptions(cpu_weight_grad_swap=False), "cpu")
