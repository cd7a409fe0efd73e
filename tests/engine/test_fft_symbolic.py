"""``torch.fft.fftn(x, dim=(1, 2)).real`` (FNet's token mixing) and ``torch.fft.fft2(x).real`` through
``wrap_model`` against PyTorch's FFT: forward values and gradients (float32 rounding, not bitwise), over
lengths that change between batches, fallback disabled and ORT proven to have run with no ``DFT`` node
(ORT has no gradient for it); and the other uses of the FFT still refused."""

from __future__ import annotations

import copy
import io
from functools import partial

import pytest
import torch
from parity import assert_parity, run_parity
from symbolic_cases import OPTIONS, Output, graph_ops

from ort_hf.engine import wrap_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FourierMixing(torch.nn.Module):
    """FNet's ``FNetBasicFourierTransform`` between two weighted ops, and ``fft2`` on a 4-D tensor."""

    def __init__(self, hidden=6):
        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden))
        self.fourier_transform = partial(torch.fft.fftn, dim=(1, 2))

    def forward(self, x, target):
        mixed = self.fourier_transform(self.lin(x)).real * self.scale
        planes = torch.fft.fft2((x * self.scale)[:, None].expand(-1, 2, -1, -1)).real.sum(1)
        y = mixed + planes * 0.1
        return Output(loss=((y - target) ** 2).mean(), out=y, masks=(mixed, planes))


def _batches(lengths=(5, 9, 16), hidden=6):
    g = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randn(2, n, hidden, generator=g), "target": torch.randn(2, n, hidden, generator=g)} for n in lengths
    ]


def test_real_part_of_fftn_is_torchs_and_trains_as_pytorch():
    batches = _batches()
    model = FourierMixing()
    reference, wrapped = copy.deepcopy(model), wrap_model(copy.deepcopy(model), OPTIONS)
    wrapped.train()
    for batch in batches:
        got, want = wrapped(**batch).masks, reference(**batch).masks
        for g_out, w_out in zip(got, want):
            torch.testing.assert_close(g_out, w_out, rtol=1e-4, atol=1e-4)
    ops = graph_ops(wrapped)
    assert "MatMul" in ops and "DFT" not in ops, ops
    assert_parity(*run_parity(model, batches, OPTIONS))


class ComplexUse(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        y = torch.fft.fftn(x * self.scale, dim=(1, 2)).abs()  # not only the real part
        return Output(loss=y.sum(), out=y)


def test_other_uses_of_the_fft_stay_refused():
    wrapped = wrap_model(ComplexUse(), OPTIONS)
    wrapped.train()
    with pytest.raises(Exception, match="aten::fft_fftn other than the real part"):
        wrapped(x=torch.randn(2, 3, 4))


def test_real_part_of_fftn_plain_export_runs_as_torch():
    """Outside ORT training (a plain torch.onnx export), with a dynamic length."""
    import onnxruntime

    from ort_hf.engine.symbolics import register_training_symbolics

    register_training_symbolics(17)

    class Mixing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = FourierMixing()

        def forward(self, x):
            return self.inner(x, torch.zeros(())).out

    model = Mixing().eval()
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.randn(2, 5, 6),),
        buffer,
        opset_version=17,
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch", 1: "length"}},
    )
    session = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 11, 6)
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    torch.testing.assert_close(got, model(x).detach(), rtol=1e-4, atol=1e-4)
