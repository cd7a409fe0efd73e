"""`adamw_ort_fused`: ORT's FusedAdam on CUDA, torch's fused AdamW (same math) on CPU."""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    logger.warning(message)


def fused_adamw_cls_and_kwargs(device_type: str, lr: float, betas: tuple[float, float], eps: float):
    """(optimizer class, kwargs) for the Trainer; parameter groups carry weight decay."""
    if device_type == "cuda":
        from .runtime import ensure_engine

        ensure_engine()
        from onnxruntime.training.optim import AdamWMode, FusedAdam

        # ADAMW_TORCH: decoupled weight decay exactly as torch.optim.AdamW (ORT's default
        # ADAMW_TRANSFORMERS places eps and decay differently).
        return FusedAdam, {"lr": lr, "betas": betas, "eps": eps, "adam_w_mode": AdamWMode.ADAMW_TORCH}
    _say_once(
        "ort_hf: adamw_ort_fused: ORT's FusedAdam is CUDA-only; on CPU it runs torch.optim.AdamW(fused=True), "
        "the same math."
    )
    return torch.optim.AdamW, {"lr": lr, "betas": betas, "eps": eps, "fused": True}
