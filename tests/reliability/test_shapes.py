"""Dynamic padding with many sequence lengths: one export, flat memory."""

import torch
from tiny_models import FAMILIES, VOCAB, build

from ort_hf.engine import ORTOptions, wrap_model


def _rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def test_fifty_sequence_lengths_export_once_and_memory_stays_flat():
    model = build(FAMILIES["bert-mlm"])
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR"))
    wrapped.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    rss = []
    for _round in range(2):
        for length in range(8, 58):  # 50 distinct lengths (dynamic padding pads to the longest)
            ids = torch.randint(3, VOCAB, (4, length), generator=gen)
            labels = ids.masked_fill(torch.rand(ids.shape, generator=gen) > 0.3, -100)
            wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        rss.append(_rss_mb())
    status = wrapped.engine_status()
    assert status.backend == "ort" and status.export_count == 1
    assert (rss[1] - rss[0]) / rss[0] < 0.05, f"RSS grew from {rss[0]:.0f} to {rss[1]:.0f} MB over the second round"
