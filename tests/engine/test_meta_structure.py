"""ORT's output-structure pass runs on meta tensors, confirmed by the trace (ort_hf/engine/meta_structure.py):
the same exported graph as the pass in PyTorch, PyTorch's losses and gradients, and a structure the trace
does not confirm is exported again from the pass in PyTorch."""

import io

import pytest
import torch
from parity import STRICT, assert_parity, run_parity
from tiny_models import EXTRA_FAMILIES, FAMILIES, build, make_batch

from ort_hf.engine import meta_structure
from ort_hf.engine.runtime import ensure_engine


@pytest.fixture
def exports(monkeypatch):
    """Every graph ORT's export wrote (bytes), and how each meta pass ended ("ran" or the error's type)."""
    ensure_engine()
    graphs, meta = [], []
    export = torch.onnx.export

    def recording_export(model, args, f, *rest, **kwargs):
        result = export(model, args, f, *rest, **kwargs)
        if isinstance(f, io.BytesIO):
            graphs.append(f.getvalue())
        return result

    meta_pass = meta_structure.meta_pass

    def recording_meta_pass(*args, **kwargs):
        try:
            out = meta_pass(*args, **kwargs)
        except Exception as exc:
            meta.append(type(exc).__name__)
            raise
        meta.append("ran")
        return out

    monkeypatch.setattr(torch.onnx, "export", recording_export)
    monkeypatch.setattr(meta_structure, "meta_pass", recording_meta_pass)
    return graphs, meta


@pytest.mark.parametrize(
    ("family", "meta_outcome"),
    [
        (FAMILIES["gpt2-clm"], "ran"),
        (EXTRA_FAMILIES["qwen2-clm"], "ran"),
        # transformers' bidirectional mask asks padding_mask.all() (a value): the pass runs in PyTorch
        (FAMILIES["bert-cls"], "RuntimeError"),
    ],
    ids=lambda x: getattr(x, "name", x),
)
def test_the_meta_pass_exports_the_graph_the_pytorch_pass_does(family, meta_outcome, exports, monkeypatch):
    graphs, meta = exports
    batches = [make_batch(family.task, torch.Generator().manual_seed(seed)) for seed in range(2)]
    result = run_parity(build(family), batches, STRICT)
    assert_parity(*result)
    assert meta == [meta_outcome] and result[-1].engine_status().export_count == 1  # no second export
    monkeypatch.setattr(meta_structure, "allowed", lambda: False)
    assert_parity(*run_parity(build(family), batches, STRICT))
    assert meta == [meta_outcome] and len(graphs) == 2
    assert graphs[0] == graphs[1]


class _DeviceBranch(torch.nn.Module):
    """Returns one more output on the meta device than on the CPU: the trace must catch it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, input_ids, attention_mask, labels):
        x = torch.nn.functional.one_hot(input_ids % 8, 8).float().mean(1)
        y = self.linear(x).squeeze(-1)
        loss = torch.nn.functional.mse_loss(y, labels.float())
        return (loss, y, y * 2) if x.device.type == "meta" else (loss, y)


def test_a_structure_the_trace_does_not_confirm_is_exported_again(exports):
    from ort_hf.engine import ORTOptions, wrap_model

    graphs, meta = exports
    torch.manual_seed(0)
    model = _DeviceBranch()
    reference = _DeviceBranch()
    reference.load_state_dict(model.state_dict())
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR", preflight="never"))
    ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}
    out, ref = wrapped(**batch), reference(**batch)
    # the trace had fewer outputs than the meta pass named: that export failed and was redone
    assert meta == ["ran"] and len(graphs) == 1 and wrapped.engine_status().export_count == 2
    assert wrapped.engine_status().backend == "ort" and len(out) == len(ref) == 2
    out[0].backward()
    ref[0].backward()
    assert torch.allclose(out[0], ref[0], atol=1e-6)
    assert torch.allclose(model.linear.weight.grad, reference.linear.weight.grad, atol=1e-6)
