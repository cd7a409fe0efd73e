"""engine/length_check.py names the sizes a training export bakes in, and the fixes for those it
found keep the graph right at any length: prim::ConstantChunk (DeBERTa), JetMoE's expert counts
(trace_fixes.py), aten::index_add with repeated indices."""

import random

import numpy as np
import pytest
import torch
from parity import assert_parity, run_parity
from tiny_models import FAMILIES, build
from torch import nn
from transformers import AutoModelForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutput

from ort_hf.engine import ORTOptions
from ort_hf.engine.length_check import find_length_constants
from ort_hf.sweep.tiny_config import tiny_config


class LongestRowPositions(nn.Module):
    """Positions up to the longest row, read into Python: the trace keeps the first batch's count."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)

    def forward(self, input_ids, attention_mask):
        longest = int(attention_mask.sum(1).max())
        positions = torch.arange(longest, dtype=torch.float32)
        return (self.embed(input_ids) * positions[None, :, None]).sum()


def _ids(rows: int, length: int) -> dict:
    ids = torch.randint(3, 50, (rows, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_names_the_baked_size_and_the_line_that_read_it():
    report = find_length_constants(LongestRowPositions(), _ids(2, 9))
    assert report and report.lengths == (9, 7)
    (node,) = report.nodes
    # positions[None, :, None] at each length
    assert node.values == ([[[float(i)] for i in range(9)]], [[[float(i)] for i in range(7)]])
    # the exporter folds arange and the indexing into one Constant, traced at the line that reads it
    assert node.source.startswith(f"{__file__}:") and "positions[None, :, None]" in node.source, node.source
    assert any(
        w.startswith(f"{__file__}:") and "Converting a tensor to a Python integer" in w for w in report.tracer_warnings
    ), report.tracer_warnings  # the int() that froze it
    assert "differs between sequence lengths 9 and 7" in str(report)


def test_reports_nothing_for_a_model_without_baked_sizes():
    batch = _ids(3, 10)
    batch["labels"] = torch.tensor([0, 1, 0])
    report = find_length_constants(build(FAMILIES["bert-cls"]), batch)
    assert not report, str(report)


def _sweep_model(model_type: str):
    config, specials = tiny_config(model_type, num_labels=2)
    torch.manual_seed(0)
    rng = random.Random(0)
    ids = torch.tensor([[rng.choice(specials.ordinary()) for _ in range(12)] for _ in range(3)])
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    ids[1, 8:] = specials.by_name["pad"]
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}
    return AutoModelForSequenceClassification.from_config(config), batch


@pytest.fixture
def orts_own_chunk_symbolic():
    """ORT 1.19.2's prim::ConstantChunk symbolic in ORT's table (and torch's registry) while the test runs."""
    from onnxruntime.training.ortmodule import _custom_op_symbolic_registry as registry

    from ort_hf.engine.runtime import ensure_engine, register_symbolics

    register_symbolics(ensure_engine(), 16)
    table = registry.CustomOpSymbolicRegistry._SYMBOLICS
    ours = table["prim::ConstantChunk"]
    table["prim::ConstantChunk"] = registry.prim_ConstantChunk
    try:
        yield
    finally:
        table["prim::ConstantChunk"] = ours
        torch.onnx.register_custom_op_symbolic("prim::ConstantChunk", ours, 16)


def test_finds_debertas_baked_length_under_orts_chunk_symbolic(orts_own_chunk_symbolic):
    model, batch = _sweep_model("deberta")
    report = find_length_constants(model, batch)
    assert report.nodes, str(report)
    for node in report.nodes:  # one per layer: the first batch's length in the context reshape
        assert node.values == (12, 10) and any(c.startswith("Reshape ") for c in node.consumers), str(report)
        assert "modeling_deberta.py" in node.source and "context_layer.size()[:-2]" in node.source, node.source


@pytest.mark.parametrize("model_type", ["deberta", "jetmoe"])
def test_sweep_models_export_the_same_graph_at_two_lengths(model_type):
    model, batch = _sweep_model(model_type)
    report = find_length_constants(model, batch)
    assert not report, str(report)


def test_jetmoe_gating_is_unchanged_in_eager_pytorch():
    from ort_hf.engine.trace_fixes import apply_trace_fixes

    model, _ = _sweep_model("jetmoe")
    assert apply_trace_fixes(model) == ["transformers.models.jetmoe.modeling_jetmoe.JetMoeTopKGating"]
    gating = model.model.layers[0].mlp.router
    counts = gating(torch.randn(10, model.config.hidden_size))[3]
    assert all(type(c) is int for c in counts) and sum(counts) == 10 * gating.top_k


class ChunkAlongSequence(nn.Module):
    """Chunks along the sequence axis, whose size only the run knows, then reads the chunks' sizes."""

    def forward(self, input_ids, attention_mask):
        first, second = input_ids.float().chunk(2, dim=1)
        return first.reshape(first.size(0) * first.size(1)).sum() + second.reshape(-1, second.size(1)).sum(0).sum()


def test_chunk_along_a_dynamic_axis_keeps_its_sizes_dynamic(tmp_path):
    import onnxruntime as ort

    model = ChunkAlongSequence()
    report = find_length_constants(model, _ids(2, 12))  # registers the symbolics for opset 16, as ORT does
    assert not report, str(report)
    path = tmp_path / "chunk.onnx"
    batch = _ids(2, 12)
    torch.onnx.export(
        model,
        tuple(batch.values()),
        str(path),
        input_names=list(batch),
        opset_version=16,
        dynamo=False,
        dynamic_axes={name: {0: "batch", 1: "sequence"} for name in batch},
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for length in (9, 14):  # odd: chunks of 5 and 4
        batch = _ids(3, length)
        got = session.run(None, {i.name: batch[i.name].numpy() for i in session.get_inputs()})[0]
        np.testing.assert_allclose(got, model(**batch).numpy(), rtol=1e-6)


class MergeRows(nn.Module):
    """Rows projected and added into a trainable table, several into the same row (a mixture of
    experts merging each token's top-k outputs)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.table = nn.Parameter(torch.randn(6, 4))
        self.proj = nn.Linear(4, 4)
        self.alpha = alpha

    def forward(self, x, index, target):
        merged = self.table.index_add(0, index, self.proj(x), alpha=self.alpha)
        return SequenceClassifierOutput(loss=((merged - target) ** 2).mean(), logits=merged)


@pytest.mark.parametrize("alpha", [1.0, 0.5])  # torch's symbolic: the last repeat wins / refused
def test_index_add_sums_repeated_indices_and_trains_both_inputs(alpha):
    g = torch.Generator().manual_seed(0)
    batches = [
        {
            "x": torch.randn(n, 4, generator=g),
            "index": torch.randint(0, 6, (n,), generator=g),
            "target": torch.randn(6, 4, generator=g),
        }
        for n in (9, 14, 5)
    ]
    assert all(len(set(b["index"].tolist())) < len(b["index"]) for b in batches)  # repeated rows
    torch.manual_seed(0)
    options = ORTOptions(fallback="disable", log_level="ERROR", preflight="never")
    assert_parity(*run_parity(MergeRows(alpha), batches, options=options), loss_atol=1e-5)
