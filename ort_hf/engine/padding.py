"""Trailing padding dropped before ORT runs a CPU batch (ORT's padding elimination is CUDA-only)."""

from __future__ import annotations

import torch


def trim_trailing_padding(inputs: dict) -> tuple[dict, int, int]:
    """Drop the trailing sequence columns that are padding in every row.

    Returns (inputs, kept length, original length). Nothing is dropped unless the batch has
    a 2-D ``attention_mask`` whose trailing columns are all 0 and, when ``labels`` are
    per-token, those label columns are all -100: the dropped positions are then masked out
    of attention and of the loss, so the loss and gradients are unchanged.
    """
    mask = inputs.get("attention_mask")
    if not torch.is_tensor(mask) or mask.dim() != 2:
        return inputs, -1, -1
    batch, length = mask.shape
    used = torch.nonzero(mask.any(dim=0)).flatten()
    keep = int(used[-1]) + 1 if used.numel() else length
    labels = inputs.get("labels")
    if torch.is_tensor(labels) and labels.shape[:2] == (batch, length) and (labels[:, keep:] != -100).any():
        return inputs, length, length
    if keep == length:
        return inputs, length, length
    trimmed = {
        k: (v[:, :keep] if torch.is_tensor(v) and v.dim() >= 2 and v.shape[:2] == (batch, length) else v)
        for k, v in inputs.items()
    }
    return trimmed, keep, length
