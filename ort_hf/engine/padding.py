"""Trailing padding dropped before ORT runs a CPU batch (ORT's padding elimination is CUDA-only)."""

from __future__ import annotations

import torch


def trim_trailing_padding(inputs: dict) -> tuple[dict, int, int]:
    """Drop the trailing sequence columns that are padding in every row.

    Returns (inputs, kept length, original length). Nothing is dropped unless the batch has
    a 2-D ``attention_mask`` whose trailing columns are all 0 and, when ``labels`` are
    per-token, those label columns are all -100: the dropped positions are then masked out
    of attention and of the loss, so the loss and gradients are unchanged. The kept columns are
    copied, contiguous as the collator made them: a column slice is a strided view, which a model
    that ``view``s its inputs (BART's and T5Gemma's label shift) cannot take.
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
        k: (v[:, :keep].contiguous() if torch.is_tensor(v) and v.dim() >= 2 and v.shape[:2] == (batch, length) else v)
        for k, v in inputs.items()
    }
    return trimmed, keep, length


def decoder_side(inputs: dict, targets_apart: bool) -> set[str]:
    """The keys of ``inputs`` not aligned with ``input_ids``'s positions: a sequence-to-sequence
    generator's ``labels`` and ``decoder_*`` tensors, which follow the target's positions (of any
    length, equal to the source's only by chance). The padding trim and the padding checks leave
    them out."""
    if not targets_apart:
        return set()
    return {k for k in inputs if k == "labels" or k.startswith("decoder_")}


def without(inputs: dict, keys: set[str]) -> dict:
    return {k: v for k, v in inputs.items() if k not in keys} if keys else inputs
