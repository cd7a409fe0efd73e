"""Where ORT's output-structure pass still runs (the trace's outputs could not be named as the
exporter names them: trace_schema), it runs on a copy that shares the weights: no parameter is
duplicated, and what forward writes (buffers, Python attributes) still stays off the model."""

import logging

import torch
from parity import UNCHECKED
from torch import nn

from ort_hf.engine import trace_schema, wrap_model


class Recorder(nn.Module):
    """Writes a buffer and an attribute in forward; records, per forward, whether it was traced
    and where its weight's memory was (a class attribute: not copied with the module)."""

    weights_seen: list = []

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.calls = 0

    def forward(self, x, labels):
        Recorder.weights_seen.append((torch.jit.is_tracing(), self.lin.weight.data_ptr()))
        self.seen += 1
        self.calls += 1
        return {"loss": nn.functional.cross_entropy(self.lin(x), labels)}


def test_structure_pass_shares_the_weights_and_leaves_buffers_and_attributes_alone(monkeypatch):
    monkeypatch.setattr(trace_schema, "name_outputs", lambda model, schema: "refused by the test")
    torch.manual_seed(0)
    model = Recorder()
    Recorder.weights_seen.clear()
    wrapped = wrap_model(model, UNCHECKED)
    wrapped.train()
    wrapped(x=torch.randn(6, 4), labels=torch.randint(0, 3, (6,)))["loss"].backward()
    status = wrapped.engine_status()
    assert status.backend == "ort"
    # Two exports (the written buffer is then carried through the graph, state_sync), each a
    # trace whose naming was refused, then ORT's way: a structure pass in PyTorch and a trace
    # (torch.onnx.export ran four times). Every forward saw the model's own weight, none a copy.
    structure_passes = [ptr for tracing, ptr in Recorder.weights_seen if not tracing]
    assert 2 * len(structure_passes) == status.export_count == 4
    assert {ptr for _, ptr in Recorder.weights_seen} == {model.lin.weight.data_ptr()}
    # What the structure passes wrote went to their copies: the model holds PyTorch's one step
    # (the buffer, carried by state_sync) and the traces' writes only (the attribute), as with a
    # full copy.
    assert int(model.seen) == 1
    assert model.calls == status.export_count


class WritesItsWeight(nn.Linear):
    def forward(self, x):
        with torch.no_grad():
            self.weight.mul_(1.0)
        return super().forward(x)


def test_a_forward_writing_its_parameters_is_named(caplog):
    wrapped = wrap_model(WritesItsWeight(4, 2), UNCHECKED)
    wrapped.train()
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        wrapped(torch.randn(3, 4)).sum().backward()
    assert wrapped.engine_status().backend == "ort"
    said = [r.getMessage() for r in caplog.records if "writes parameters in place" in r.getMessage()]
    assert len(said) == 1 and "(weight)" in said[0], said
