"""``scatter_reduce(..., include_self=False)`` (TAPAS' segment reductions) through ``wrap_model`` against
PyTorch: ``sum`` and ``mean`` of values that need a gradient into a ``self`` that needs one too,
``amin`` / ``amax`` of integer ids and of a float that cannot need a gradient (and refused where it could), with repeated indices and positions no
index writes; forward values and gradients, fallback disabled and ORT proven to have run."""

from __future__ import annotations

import copy
import dataclasses
import io

import pytest
import torch
from parity import assert_parity, run_parity
from symbolic_cases import OPTIONS, Output, graph_ops

from ort_hf.engine import wrap_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEGMENTS = 7  # the index below never writes segments 5 and 6


class SegmentReductions(torch.nn.Module):
    """TAPAS' ``_segment_reduce``: flat values reduced per segment, on dim 0 and (2-D) on dim 1."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))
        self.base = torch.nn.Parameter(torch.linspace(-1.0, 1.0, SEGMENTS))

    def forward(self, values, index, ids, target):
        flat = (values * self.scale).sum(-1)
        flat_index = index.reshape(-1)
        base = self.base * 2  # self needs a gradient: it reaches only the positions no index writes
        sums = base.scatter_reduce(0, flat_index, flat, "sum", include_self=False)
        means = torch.zeros(SEGMENTS).scatter_reduce(0, flat_index, flat, reduce="mean", include_self=False)
        rows = (values * self.scale).transpose(0, 1)  # [3, n]: reduce along dim 1
        row_means = (
            base[None]
            .expand(3, SEGMENTS)
            .scatter_reduce(1, index[None].expand(3, -1), rows, "mean", include_self=False)
        )
        firsts = torch.full((SEGMENTS,), 99).scatter_reduce(0, index, ids, "amin", include_self=False)
        lasts = torch.zeros(SEGMENTS, dtype=torch.long).scatter_reduce(0, index, ids, "amax", include_self=False)
        # a float reached from no float input (TAPAS' labels as float32): it cannot need a gradient
        peaks = torch.zeros(SEGMENTS).scatter_reduce(0, index, ids.float() * 0.5, "amax", include_self=False)
        row_peaks = torch.zeros(3, SEGMENTS, dtype=torch.long).scatter_reduce(  # along dim 1, rows differing
            1, index[None].expand(3, -1), ids[None] * (torch.arange(3)[:, None] * 2 - 1), "amax", include_self=False
        )
        mixed = sums + means * 0.5 + row_means.sum(0) + (firsts + lasts + row_peaks.sum(0)).float() * 0.01 + peaks
        return Output(
            loss=((mixed - target) ** 2).mean(),
            out=mixed,
            masks=(sums, means, row_means, firsts, lasts, peaks, row_peaks),
        )


def _batches(n=3, length=12):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        index = torch.randint(0, 5, (length,), generator=g)  # repeats; 5 and 6 untouched
        values = torch.randn(length, 3, generator=g)
        out.append(
            {
                "values": values,
                "index": index,
                "ids": torch.randint(-50, 50, (length,), generator=g),
                "target": torch.randn(SEGMENTS, generator=g),
            }
        )
    return out


@pytest.mark.parametrize("opset", [16, 18])
def test_scatter_reduce_without_self_is_torchs_and_trains_as_pytorch(opset):
    options = dataclasses.replace(OPTIONS, opset_version=opset)
    batches = _batches()
    model = SegmentReductions()
    reference, wrapped = copy.deepcopy(model), wrap_model(copy.deepcopy(model), options)
    wrapped.train()
    for batch in batches:
        got, want = wrapped(**batch).masks, reference(**batch).masks
        for g_out, w_out in zip(got, want):
            assert g_out.dtype == w_out.dtype
            torch.testing.assert_close(g_out, w_out, rtol=1e-6, atol=1e-6)
    assert "ScatterElements" in graph_ops(wrapped)
    assert_parity(*run_parity(model, batches, options))


class GradientThroughMax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x, index):
        y = torch.zeros(3).scatter_reduce(0, index, x * self.scale, "amax", include_self=False)
        return Output(loss=y.sum(), out=y)


def test_scatter_reduce_max_needing_a_gradient_is_refused():
    wrapped = wrap_model(GradientThroughMax(), OPTIONS)
    wrapped.train()
    with pytest.raises(Exception, match="may need a gradient"):
        wrapped(x=torch.randn(4), index=torch.tensor([0, 1, 1, 0]))


def test_scatter_reduce_without_self_plain_export_runs_as_torch():
    """Outside ORT training (a plain torch.onnx export, where no gradient is asked): every reduction,
    including ``amax`` of a float reached from a parameter, with a dynamic length."""
    import onnxruntime

    from ort_hf.engine.symbolics import register_training_symbolics

    register_training_symbolics(16)

    class Reductions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))

        def forward(self, values, index):
            flat = (values * self.scale).sum(-1)
            return torch.stack(
                [
                    torch.ones(SEGMENTS).scatter_reduce(0, index, flat, reduce, include_self=False)
                    for reduce in ("sum", "mean", "amax", "amin")
                ]
            )

    model = Reductions().eval()
    batch = _batches(n=1)[0]
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        (batch["values"], batch["index"]),
        buffer,
        opset_version=16,
        dynamo=False,
        input_names=["values", "index"],
        dynamic_axes={"values": {0: "n"}, "index": {0: "n"}},
    )
    session = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    values, index = torch.randn(20, 3), torch.randint(0, 5, (20,))
    got = torch.from_numpy(session.run(None, {"values": values.numpy(), "index": index.numpy()})[0])
    torch.testing.assert_close(got, model(values, index).detach(), rtol=1e-6, atol=1e-6)
