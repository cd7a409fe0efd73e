"""The post-export repairs of ORT's gradient graph build (engine/graph_repairs.py), through
``wrap_model`` against PyTorch with fallback disabled:

- a float->float ``Cast`` feeding one node twice (``Mul(y, y)``: gated delta-net layers' l2norm),
  which ORT's PropagateCastOps failed to remove ("Argument mismatch when removing edge");
- a parameter that reaches the loss only through ``topk`` indices (sparse-attention indexers):
  no gradient in PyTorch, and ORT refused to build the gradient graph;
- an empty zero state read by two ``torch.cat`` (Inkling2's block states): ORT's Concat gradient
  defined its gradient twice ("Duplicate definition of name");
- PhiMoE's router Function, whose backward returns None for four of its inputs: ORT's
  GatherElementsGrad missed the gradient it expected from the PythonOp ("Missing Input").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from parity import assert_parity, run_parity
from transformers.models.phimoe.modeling_phimoe import PhimoeMultiplier
from transformers.utils import ModelOutput

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.engine.graph_repairs import (
    detach_function_inputs,
    drop_empty_concat_inputs,
    drop_noop_casts,
    unreachable_parameters,
)

OPTIONS = ORTOptions(fallback="disable", log_level="ERROR", intra_op_threads=1, preflight="never")


@dataclass
class Output(ModelOutput):
    loss: torch.Tensor | None = None


class SquaredAfterCast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, target):
        y = self.lin(x).to(torch.float32)  # exported as Cast(to=float) of a float tensor
        return Output(loss=((y * y - target) ** 2).mean())


class TopkIndexed(torch.nn.Module):
    """``score`` only chooses which rows of ``value(x)`` the loss reads: no gradient reaches it."""

    def __init__(self):
        super().__init__()
        self.value = torch.nn.Linear(4, 4)
        self.score = torch.nn.Linear(4, 1)

    def forward(self, x, target):
        rows = self.score(x).squeeze(-1).topk(2, dim=-1).indices
        picked = torch.gather(self.value(x), 1, rows.unsqueeze(-1).expand(-1, -1, 4))
        return Output(loss=((picked - target) ** 2).mean())


class EmptyStateConcatenatedTwice(torch.nn.Module):
    """Inkling2's block states: an empty zero tensor that two ``torch.cat`` extend."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, target):
        h = self.lin(x)
        empty = h.new_zeros(*h.shape[:-1], 0, h.shape[-1])  # ConstantOfShape: no gradient reaches it
        one = torch.cat([empty, h.unsqueeze(-2)], dim=-2)
        two = torch.cat([empty, h.unsqueeze(-2), (h * h).unsqueeze(-2)], dim=-2)
        return Output(loss=((one.sum(-2) + two.sum(-2) - target) ** 2).mean())


class SparsemixerRouter(torch.nn.Module):
    """PhiMoE's sparsemixer in small: the Function's backward is an estimate for ``scores`` alone and
    returns None for the gathered gate, the chosen expert, the gates and the mask."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(4, 3)

    def forward(self, x, target):
        scores = self.gate(x)
        gates = torch.softmax(scores, dim=-1)
        chosen = gates.max(dim=-1, keepdim=True).indices
        gathered = gates.gather(dim=-1, index=chosen)  # GatherElements: ORT built its gradient
        mask_for_one = torch.add(0.3333, chosen == 0, alpha=0.6667).type_as(gates)
        multiplier = PhimoeMultiplier.apply(scores, gathered, chosen, gates, mask_for_one)
        return Output(loss=((multiplier.squeeze(-1) - target) ** 2).mean())


def _batches(x_shape, target_shape, n=3):
    g = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randn(*x_shape, generator=g), "target": torch.randn(*target_shape, generator=g)} for _ in range(n)
    ]


@pytest.mark.usefixtures("one_torch_thread")
def test_noop_cast_feeding_one_node_twice_trains_at_parity():
    torch.manual_seed(0)
    assert_parity(*run_parity(SquaredAfterCast(), _batches((2, 4), (2, 4)), OPTIONS))


@pytest.mark.usefixtures("one_torch_thread")
def test_empty_state_read_by_two_concats_trains_at_parity():
    torch.manual_seed(0)
    assert_parity(*run_parity(EmptyStateConcatenatedTwice(), _batches((2, 3, 4), (2, 3, 4)), OPTIONS))


@pytest.mark.usefixtures("one_torch_thread", "aten_nodes_run")
def test_function_inputs_its_backward_gives_no_gradient_train_at_parity():
    torch.manual_seed(0)
    assert_parity(*run_parity(SparsemixerRouter(), _batches((2, 5, 4), (2, 5)), OPTIONS))


@pytest.mark.usefixtures("one_torch_thread")
def test_parameter_reached_only_through_topk_indices_keeps_no_gradient_as_in_pytorch():
    torch.manual_seed(0)
    model = TopkIndexed()
    initial = copy.deepcopy(model.state_dict())
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, OPTIONS)
    wrapped.train()
    runs = {}
    for name, net, params in (("torch", reference, reference), ("ort", wrapped, model)):
        # AdamW's weight decay would move a parameter whose grad were zeros rather than None.
        opt = torch.optim.AdamW(params.parameters(), lr=1e-2, weight_decay=0.1)
        losses, grads = [], []
        for batch in _batches((2, 5, 4), (2, 2, 4)):
            loss = net(**batch).loss
            loss.backward()
            losses.append(loss.item())
            grads.append({n: None if p.grad is None else p.grad.clone() for n, p in params.named_parameters()})
            opt.step()
            opt.zero_grad(set_to_none=True)
        runs[name] = losses, grads
    assert wrapped.engine_status().backend == "ort"
    (ref_losses, ref_grads), (ort_losses, ort_grads) = runs["torch"], runs["ort"]
    assert max(abs(a - b) for a, b in zip(ref_losses, ort_losses)) <= 1e-5
    for ref_step, ort_step in zip(ref_grads, ort_grads):
        assert {n for n, g in ref_step.items() if g is None} == {"score.weight", "score.bias"}
        assert {n for n, g in ort_step.items() if g is None} == {"score.weight", "score.bias"}
        for n in ("value.weight", "value.bias"):
            torch.testing.assert_close(ort_step[n], ref_step[n], rtol=1e-4, atol=1e-6)
    for n, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[n], rtol=1e-4, atol=1e-6)
    assert torch.equal(model.score.weight, initial["score.weight"])  # never stepped, as in PyTorch


def _graph(nodes, inputs, outputs, value_info=()):
    def info(name, t):
        return helper.make_tensor_value_info(name, t, [2, 2])

    graph = helper.make_graph(
        nodes, "g", [info(*i) for i in inputs], [info(*o) for o in outputs], value_info=[info(*v) for v in value_info]
    )
    return helper.make_model(graph)


def test_drop_noop_casts_keeps_type_changing_casts_and_graph_outputs():
    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    model = _graph(
        [
            helper.make_node("Cast", ["x"], ["same"], to=f),
            helper.make_node("Mul", ["same", "same"], ["sq"]),
            helper.make_node("Cast", ["sq"], ["half"], to=h),
            helper.make_node("Cast", ["x"], ["out"], to=f),
        ],
        inputs=[("x", f)],
        outputs=[("half", h), ("out", f)],
        value_info=[("same", f), ("sq", f)],
    )
    assert drop_noop_casts(model) == 1
    onnx.checker.check_model(model)
    assert [(n.op_type, list(n.input)) for n in model.graph.node] == [
        ("Mul", ["x", "x"]),
        ("Cast", ["sq"]),
        ("Cast", ["x"]),
    ]
    assert "same" not in {v.name for v in model.graph.value_info}


def test_unreachable_parameters_stop_only_at_integer_values():
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    model = _graph(
        [
            helper.make_node("MatMul", ["x", "w_score"], ["s"]),
            helper.make_node("TopK", ["s", "k"], ["top", "idx"], axis=-1),
            helper.make_node("MatMul", ["x", "w_value"], ["v"]),
            helper.make_node("Gather", ["v", "idx"], ["picked"], axis=0),
            helper.make_node("Pow", ["picked", "w_exp"], ["y"]),
        ],  # ORT stops at Pow's exponent; kept here
        inputs=[("x", f), ("w_score", f), ("w_value", f), ("w_exp", f), ("k", i64)],
        outputs=[("y", f)],
        value_info=[("s", f), ("top", f), ("idx", i64), ("v", f), ("picked", f)],
    )
    assert unreachable_parameters(model, ["w_score", "w_value", "w_exp"]) == ["w_score"]


def test_drop_empty_concat_inputs_keeps_sized_and_unknown_inputs():
    f = TensorProto.FLOAT

    def info(name, shape):
        return helper.make_tensor_value_info(name, f, shape)

    graph = helper.make_graph(
        [
            helper.make_node("Concat", ["empty", "x", "unknown"], ["y"], axis=-2),
            helper.make_node("Concat", ["empty", "empty"], ["z"], axis=1),
        ],  # all empty: left as is
        "g",
        [info("empty", ["b", 0, 4]), info("x", ["b", 1, 4]), info("unknown", ["b", "n", 4])],
        [info("y", ["b", None, 4]), info("z", ["b", 0, 4])],
    )
    model = helper.make_model(graph)
    assert drop_empty_concat_inputs(model) == 1
    onnx.checker.check_model(model)
    assert [list(n.input) for n in model.graph.node] == [["x", "unknown"], ["empty", "empty"]]


def test_detach_function_inputs_detaches_listed_float_inputs_only():
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    python_op = helper.make_node(
        "PythonOp", ["s", "idx", "g"], ["y"], "op", domain="com.microsoft", func_name="pkg.Fn", input_convention="dcdd"
    )  # arg 1 is a constant
    graph = helper.make_graph(
        [python_op],
        "g",
        [
            helper.make_tensor_value_info("s", f, [2]),
            helper.make_tensor_value_info("idx", i64, [2]),
            helper.make_tensor_value_info("g", f, [2]),
        ],
        [helper.make_tensor_value_info("y", f, [2])],
    )
    model = helper.make_model(graph)
    assert detach_function_inputs(model, {"pkg.Fn": (2, 3)}) == 1  # arg 2 is the int tensor: left
    (detach, op) = model.graph.node
    assert (detach.op_type, detach.domain, list(detach.input)) == ("ATen", "org.pytorch.aten", ["g"])
    assert list(op.input) == ["s", "idx", detach.output[0]]
    assert {a.name: a.s for a in detach.attribute}["operator"] == b"detach_copy"
    assert detach_function_inputs(model, {"other.Fn": (0,)}) == 0
