"""Casts to their input's own type (``engine/graph_repairs.py``): ORT 1.19.2's ``PropagateCastOps``
failed the graph build ("Argument mismatch when removing edge") on ``x.float().square()`` of a float
``x`` (DeepSeek-V4's unweighted RMSNorm). Forward and gradient through ORT (fallback disabled)
against PyTorch; the casts that change a type stay."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from parity import assert_parity, run_parity
from transformers.utils import ModelOutput

from ort_hf.engine import ORTOptions

OPTIONS = ORTOptions(fallback="disable", log_level="ERROR", intra_op_threads=1, preflight="never")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class Output(ModelOutput):
    loss: torch.Tensor | None = None


class Upcasts(torch.nn.Module):
    """DeepSeek-V4's unweighted RMSNorm and hyper-connection mix, in float32 already."""

    def __init__(self, width=8):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.mix = torch.nn.Parameter(torch.randn(width, width) * 0.3)

    def forward(self, x, target):
        h = self.lin(x)
        h = h * torch.rsqrt(h.float().square().mean(-1, keepdim=True) + 1e-6).to(h.dtype)
        y = torch.nn.functional.linear(h.float(), self.mix.float())
        y = y + (y.to(torch.float64) * 0.5).float()  # casts that change the type: they stay
        return Output(loss=((y - target) ** 2).mean())


def test_float_of_float_trains_as_pytorch():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(n, 8, generator=g), "target": torch.randn(n, 8, generator=g)} for n in (3, 5, 4)]
    result = run_parity(Upcasts(), batches, OPTIONS)
    assert_parity(*result)
    graph = result[-1].training_graph().graph
    to = [next(a.i for a in n.attribute if a.name == "to") for n in graph.node if n.op_type == "Cast"]
    assert 11 in to, to  # to DOUBLE kept (and back to FLOAT, which ORT may fold into the gradient's casts)
