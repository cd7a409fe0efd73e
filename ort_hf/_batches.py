"""Cutting a batch to its first rows (quick probes on the first batch)."""

from __future__ import annotations

import torch


def first_rows(values: list, rows: int) -> list | None:
    """``values`` with every tensor cut to its first ``rows`` rows, or None when the tensors do not
    share one leading (batch) dimension longer than ``rows``."""
    batched = [t for t in values if isinstance(t, torch.Tensor) and t.ndim > 0]
    if not batched or batched[0].shape[0] <= rows or any(t.shape[0] != batched[0].shape[0] for t in batched):
        return None
    return [t[:rows] if isinstance(t, torch.Tensor) and t.ndim > 0 else t for t in values]


def first_rows_of(batch: dict, rows: int) -> dict:
    """The batch's first ``rows`` rows, or the whole batch when it has no single batch dimension
    longer than that."""
    cut = first_rows(list(batch.values()), rows)
    return dict(batch) if cut is None else dict(zip(batch, cut))
