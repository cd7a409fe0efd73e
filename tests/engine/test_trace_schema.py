"""The export takes its output structure from the trace: the same graph and schema as ORT's own
export with its output-structure pass, byte for byte, and the model runs once per export."""

from dataclasses import dataclass

import pytest
import torch
from parity import UNCHECKED, assert_parity, run_parity
from test_pythonop import ReluAndSquare
from tiny_models import EXTRA_FAMILIES, FAMILIES, build, make_batch
from transformers.utils import ModelOutput

from ort_hf.engine import trace_schema, wrap_model
from ort_hf.engine.output_schema import same
from ort_hf.module_with_loss import ModuleWithLoss


@dataclass
class _ThreeOutputs(ModelOutput):
    loss: torch.Tensor | None = None
    relu: torch.Tensor | None = None
    square: torch.Tensor | None = None


class _TwoTensorFunction(torch.nn.Module):
    """A custom autograd Function (a PythonOp in ORT's graph) and a ModelOutput of three tensors."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, labels):
        relu, square = ReluAndSquare.apply(self.lin(x))
        return _ThreeOutputs(torch.nn.functional.mse_loss(relu + square, labels), relu, square)


def _both_ways(monkeypatch) -> list:
    """Each export, done ort_hf's way (kept) and ORT's own way (for comparison)."""
    pairs = []
    ours = trace_schema.export_with_schema_from_trace

    def spy(original, **kwargs):
        result = ours(original, **kwargs)
        pairs.append((result, original(**kwargs)))
        return result

    monkeypatch.setattr(trace_schema, "export_with_schema_from_trace", spy)
    return pairs


CASES = {
    "bert-cls": lambda: (build(FAMILIES["bert-cls"]), "cls"),
    "gpt2-clm": lambda: (build(FAMILIES["gpt2-clm"]), "clm"),
    "t5-s2s": lambda: (build(EXTRA_FAMILIES["t5-s2s"]), "s2s"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_graph_and_schema_as_ort_exports_them(case, monkeypatch):
    pairs = _both_ways(monkeypatch)
    model, task = CASES[case]()
    gen = torch.Generator().manual_seed(0)
    result = run_parity(model, [make_batch(task, gen) for _ in range(2)], UNCHECKED)
    assert_parity(*result)
    assert pairs, "the engine exported nothing"
    for (graph, schema), (their_graph, their_schema) in pairs:
        assert [o.name for o in graph.graph.output][:1] == ["output-0"]
        assert graph.SerializeToString() == their_graph.SerializeToString()
        assert same(schema, their_schema), (schema, their_schema)


def test_module_with_loss_graph(monkeypatch):
    pairs = _both_ways(monkeypatch)
    wrapped = wrap_model(ModuleWithLoss(build(FAMILIES["llama-clm"])), UNCHECKED)
    wrapped.train()
    wrapped(**make_batch("clm", torch.Generator().manual_seed(0)))["loss"].backward()
    assert wrapped.engine_status().backend == "ort"
    (graph, schema), (their_graph, their_schema) = pairs[0]
    assert graph.SerializeToString() == their_graph.SerializeToString()
    assert same(schema, their_schema)


def test_pythonop_graph_with_three_outputs(monkeypatch):
    pairs = _both_ways(monkeypatch)
    torch.manual_seed(0)
    batches = [{"x": torch.randn(4, 8), "labels": torch.randn(4, 8)} for _ in range(2)]
    ref_losses, ort_losses, ref_grads, ort_grads, wrapped = run_parity(_TwoTensorFunction(), batches, UNCHECKED)
    assert_parity(ref_losses, ort_losses, ref_grads, ort_grads, wrapped)
    (graph, schema), (their_graph, their_schema) = pairs[0]
    assert any(node.op_type == "PythonOp" for node in graph.graph.node)
    assert [o.name for o in graph.graph.output] == ["output-0", "output-1", "output-2"]
    assert graph.SerializeToString() == their_graph.SerializeToString()
    assert same(schema, their_schema) and list(schema) == ["loss", "relu", "square"]


def test_renaming_refused_where_the_exporter_would_do_otherwise():
    import onnx
    from onnx import TensorProto, helper

    def model(outputs, inputs=("x",)):
        node = helper.make_node("Relu", ["x"], ["y"])
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in outputs],
        )
        return helper.make_model(graph)

    stub = trace_schema_stub()
    assert "repeated" in trace_schema.name_outputs(model(["y", "y"]), [stub, stub])
    assert "not computed by a node" in trace_schema.name_outputs(model(["x"]), [stub])
    assert "already named" in trace_schema.name_outputs(model(["y"], inputs=("x", "output-0")), [stub])
    assert "2 tensors" in trace_schema.name_outputs(model(["y"]), [stub, stub])
    renamed = model(["y"])
    assert trace_schema.name_outputs(renamed, [stub]) is None
    assert renamed.graph.node[0].output == ["output-0"]
    assert renamed.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "output-0_dim0"
    onnx.checker.check_model(renamed)


def trace_schema_stub():
    from onnxruntime.training.utils.torch_io_helper import _TensorStub

    return _TensorStub(0, dtype="torch.float32", shape_dims=1)


def test_the_model_runs_once_per_export(monkeypatch):
    calls = []
    model = build(FAMILIES["bert-cls"])
    model.register_forward_pre_hook(lambda module, args: calls.append(torch.jit.is_tracing()))
    gen = torch.Generator().manual_seed(0)
    ref_losses, ort_losses, ref_grads, ort_grads, wrapped = run_parity(
        model, [make_batch("cls", gen) for _ in range(2)], UNCHECKED
    )
    assert_parity(ref_losses, ort_losses, ref_grads, ort_grads, wrapped)
    # The PyTorch reference's two steps (its deep copy keeps the hook); under ORT, its graph runs
    # and the model's forward is the trace only, once per export.
    assert sorted(calls) == [False] * 2 + [True] * wrapped.engine_status().export_count
