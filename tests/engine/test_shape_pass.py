"""Inside ORT's export, torch's ONNX shape inference gets no weight values (ort_hf/engine/shape_pass.py):
the exported graph is the same byte for byte, and ORT's own export goes through it."""

import io

import pytest
import torch
from parity import STRICT, assert_parity, run_parity
from tiny_models import EXTRA_FAMILIES, FAMILIES, build, make_batch

import ort_hf.engine.shape_pass as shape_pass
from ort_hf.engine.runtime import ensure_engine


@pytest.fixture
def withheld(monkeypatch):
    """One entry per value the pass saw inside weights_withheld(): True where it was withheld."""
    seen = []
    decides_no_shape = shape_pass.decides_no_shape

    def counting(value):
        dropped = decides_no_shape(value)
        seen.append(dropped)
        return dropped

    monkeypatch.setattr(shape_pass, "decides_no_shape", counting)
    return seen


def _export(model, batch) -> bytes:
    out = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            model,
            (batch["input_ids"], batch["attention_mask"]),
            out,
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
            export_params=False,
            keep_initializers_as_inputs=True,
            do_constant_folding=False,
            opset_version=17,
            input_names=["input_ids", "attention_mask"],
            dynamic_axes={"input_ids": [0, 1]},
        )
    return out.getvalue()


@pytest.mark.parametrize("family", [FAMILIES["bert-mlm"], EXTRA_FAMILIES["qwen2-clm"]], ids=lambda f: f.name)
def test_withholding_weight_values_exports_the_same_graph(family, withheld):
    ensure_engine()  # installs the pass's replacement
    model = build(family)
    model.config.use_cache = False  # the trace cannot return a DynamicCache
    batch = make_batch(family.task, torch.Generator().manual_seed(0))
    plain = _export(model, batch)
    assert not withheld  # outside weights_withheld() every value reaches the pass
    with shape_pass.weights_withheld():
        without_weights = _export(model, batch)
    assert sum(withheld) >= len([p for p in model.parameters() if p.dim() >= 2])
    assert not all(withheld)  # biases, norms and integer buffers keep their values
    assert without_weights == plain


def test_ort_export_runs_the_pass_without_weight_values(withheld):
    model = build(FAMILIES["llama-clm"])
    batches = [make_batch("clm", torch.Generator().manual_seed(seed)) for seed in range(2)]
    assert_parity(*run_parity(model, batches, STRICT))
    assert sum(withheld) >= len([p for p in model.parameters() if p.dim() >= 2])
