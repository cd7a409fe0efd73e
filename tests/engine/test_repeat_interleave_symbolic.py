"""``aten::repeat_interleave`` (``engine/symbolics/repeat_interleave.py``): torch's symbolic rewrote the
traced graph's pooled ``-1`` constant in place, so an interleaved RoPE (``repeat_interleave(2, dim=-1)``
of ``cos`` before ``rotate_half``'s ``stack(dim=-1).flatten(-2)``) exported its stack on the wrong
axis, and ORT refused Helium, Cohere, ERNIE 4.5, CANINE and GLM at export. Forward and gradient
through ORT (fallback disabled) against PyTorch, and the plain export against onnxruntime."""

from __future__ import annotations

import io

import pytest
import torch
from parity import assert_parity, run_parity
from symbolic_cases import OPTIONS, Output

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rotate_half_interleaved(x):
    # Helium's / Cohere's / GLM's rotate_half
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


class InterleavedRope(torch.nn.Module):
    """Attention-shaped query [batch, heads, length, head_dim], rotated as Helium does, over the first
    ``rotary`` dims of the head only when ``rotary < head_dim`` (GLM's partial rotary)."""

    def __init__(self, heads=2, head_dim=8, rotary=8, repeats_dim=-1):
        super().__init__()
        self.proj = torch.nn.Linear(heads * head_dim, heads * head_dim)
        self.register_buffer("inv_freq", 1.0 / (100 ** (torch.arange(0, rotary, 2).float() / rotary)))
        self.heads, self.head_dim, self.rotary, self.repeats_dim = heads, head_dim, rotary, repeats_dim

    def forward(self, x, target):
        batch, length, _ = x.shape
        q = self.proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        freqs = torch.arange(length, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[None, None]  # [1, 1, length, rotary]
        half = emb.shape[-1] // 2
        dim = self.repeats_dim if self.repeats_dim < 0 else 3
        cos = emb.cos()[..., :half].repeat_interleave(2, dim=dim)
        sin = emb.sin()[..., :half].repeat_interleave(2, dim=dim)
        q_rot, q_pass = q[..., : self.rotary], q[..., self.rotary :]
        y = torch.cat([q_rot * cos + rotate_half_interleaved(q_rot) * sin, q_pass], dim=-1)
        y = y.softmax(dim=-1)  # another reader of the pooled -1
        return Output(loss=((y - target) ** 2).mean(), out=y)


CASES = {
    "helium": {},
    "glm-partial-rotary": {"head_dim": 8, "rotary": 4},
    "positive-dim": {"repeats_dim": 3},  # torch's symbolic changed nothing here: the control
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_interleaved_rope_trains_as_pytorch(case):
    torch.manual_seed(0)
    model = InterleavedRope(**CASES[case])
    g = torch.Generator().manual_seed(0)
    batches = [
        {"x": torch.randn(2, n, 16, generator=g), "target": torch.rand(2, 2, n, 8, generator=g)} for n in (5, 7, 4)
    ]
    assert_parity(*run_parity(model, batches, OPTIONS))


def test_interleaved_rope_plain_export_runs_as_torch():
    """Outside ORT training (any torch.onnx export at a registered opset), with dynamic lengths."""
    import onnxruntime

    from ort_hf.engine.symbolics import register_training_symbolics

    register_training_symbolics(17)

    class Rotated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = InterleavedRope()

        def forward(self, x):
            return self.inner(x, torch.zeros(())).out

    model = Rotated().eval()
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.randn(2, 5, 16),),
        buffer,
        opset_version=17,
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch", 1: "length"}},
    )
    session = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 6, 16)
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    torch.testing.assert_close(got, model(x).detach(), rtol=1e-5, atol=1e-6)
