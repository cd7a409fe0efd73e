"""Buffers that forward writes (BatchNorm statistics, counters) change under ORT as in PyTorch."""

import copy
import logging

import torch
from parity import UNCHECKED
from torch import nn

from ort_hf.engine import wrap_model


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(64, 3)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.python_calls = 0

    def forward(self, x, labels):
        self.seen += x.shape[0]
        self.python_calls += 1
        logits = self.head(torch.relu(self.norm(self.conv(x))).flatten(1))
        return {"loss": nn.functional.cross_entropy(logits, labels)}


def test_batchnorm_statistics_and_written_buffers_follow_pytorch(caplog):
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, UNCHECKED)
    wrapped.train()
    g = torch.Generator().manual_seed(1)
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        for rows in (8, 5, 8):  # a second batch size: the counter follows the real batch
            x, y = torch.randn(rows, 1, 4, 4, generator=g), torch.randint(0, 3, (rows,), generator=g)
            ref_loss, loss = reference(x, y)["loss"], wrapped(x=x, labels=y)["loss"]
            torch.testing.assert_close(loss, ref_loss)
            (ref_loss + loss).backward()
    assert wrapped.engine_status().backend == "ort"
    state, ref_state = model.state_dict(), reference.state_dict()
    assert int(state["norm.num_batches_tracked"]) == 3 and int(state["seen"]) == 21
    for name in ("norm.running_mean", "norm.running_var", "norm.num_batches_tracked", "seen"):
        torch.testing.assert_close(state[name], ref_state[name], msg=lambda m: f"{name}: {m}")
    said = [r.getMessage() for r in caplog.records if "Python attributes" in r.getMessage()]
    assert len(said) == 1 and "Net.python_calls" in said[0], said


def test_a_model_that_writes_nothing_is_exported_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    wrapped = wrap_model(model, UNCHECKED)
    wrapped.train()
    for _ in range(2):
        wrapped(torch.randn(3, 4)).sum().backward()
    assert wrapped.engine_status().backend == "ort" and wrapped.engine_status().export_count == 1
    assert wrapped._run.stateful is None
