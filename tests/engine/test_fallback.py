"""Ops ORT cannot handle: fall back to PyTorch with the reason logged once, or raise naming the op."""

import logging

import pytest
import torch

from ort_hf.engine import ORTFallbackError, ORTOptions, wrap_model


class WithEigh(torch.nn.Module):
    """aten::linalg_eigh has no ONNX export."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return y * torch.linalg.eigh(y.T @ y)[0].sum()


class WithUnique(torch.nn.Module):
    """Exports (ONNX Unique) but ORT has no gradient builder for it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return y * torch.unique(y.detach()).sum()


def _train(wrapped, model, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(steps):
        wrapped(torch.randn(3, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize(
    "module_cls,reason",
    [(WithEigh, "unsupported op aten::linalg_eigh"), (WithUnique, "no gradient for ONNX op Unique")],
)
def test_auto_fallback_trains_in_pytorch_and_says_why_once(module_cls, reason, caplog):
    model = module_cls()
    wrapped = wrap_model(model, ORTOptions(fallback="auto", log_level="ERROR"))
    wrapped.train()
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        assert _train(wrapped, model), "parameters did not change"
    status = wrapped.engine_status()
    assert status.backend == "pytorch"
    assert reason in status.fallback_reason
    messages = [r.getMessage() for r in caplog.records if "training continues in PyTorch" in r.getMessage()]
    assert len(messages) == 1 and reason in messages[0]


@pytest.mark.parametrize("module_cls,op", [(WithEigh, "aten::linalg_eigh"), (WithUnique, "Unique")])
def test_disabled_fallback_raises_naming_the_op(module_cls, op):
    wrapped = wrap_model(module_cls(), ORTOptions(fallback="disable", log_level="ERROR"))
    wrapped.train()
    with pytest.raises(ORTFallbackError, match=op):
        wrapped(torch.randn(3, 4))
