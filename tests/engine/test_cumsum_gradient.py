"""ORT 1.19.2 has no gradient for ONNX ``CumSum`` (gated delta-net layers' ``decay.cumsum``): the
one ort_hf registers (symbolics/packed_sequences.py), through ``wrap_model`` against PyTorch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from parity import assert_parity, run_parity
from transformers.utils import ModelOutput

from ort_hf.engine import ORTOptions

OPTIONS = ORTOptions(fallback="disable", log_level="ERROR", intra_op_threads=1, preflight="never")


@dataclass
class Output(ModelOutput):
    loss: torch.Tensor | None = None


class Cumulative(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, target):
        y = self.lin(x).cumsum(dim=self.dim)
        return Output(loss=((y - target) ** 2 * torch.arange(1.0, 5.0)).mean())  # weights differ per position


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("dim", [1, -1])
def test_cumsum_gradient_matches_pytorch(dim):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(dim)
    batches = [{"x": torch.randn(2, 3, 4, generator=g), "target": torch.randn(2, 3, 4, generator=g)} for _ in range(3)]
    assert_parity(*run_parity(Cumulative(dim), batches, OPTIONS))
