"""`adamw_ort_fused`: ORT's FusedAdam on CUDA, torch's fused AdamW (same math) on CPU; ORT's
FP16_Optimizer for DeepSpeed ZeRO-1/2 with fp16."""

from __future__ import annotations

import functools
import logging
import warnings

import torch

logger = logging.getLogger(__name__)


@functools.cache
def _say_once(message: str) -> None:
    logger.warning(message)


def fused_adamw_cls_and_kwargs(device_type: str, lr: float, betas: tuple[float, float], eps: float):
    """(optimizer class, kwargs) for the Trainer; parameter groups carry weight decay."""
    if device_type == "cuda":
        from .extensions import require
        from .runtime import ensure_engine

        ensure_engine()
        require("fused_ops")  # its build error, not the ImportError inside FusedAdam
        from onnxruntime.training.optim import AdamWMode, FusedAdam

        # ADAMW_TORCH: decoupled weight decay exactly as torch.optim.AdamW (ORT's default
        # ADAMW_TRANSFORMERS places eps and decay differently).
        return FusedAdam, {"lr": lr, "betas": betas, "eps": eps, "adam_w_mode": AdamWMode.ADAMW_TORCH}
    _say_once(
        "ort_hf: adamw_ort_fused: ORT's FusedAdam is CUDA-only; on CPU it runs torch.optim.AdamW(fused=True), "
        "the same math."
    )
    return torch.optim.AdamW, {"lr": lr, "betas": betas, "eps": eps, "fused": True}


def apply_fp16_optimizer(optimizer) -> str | None:
    """ORT's ``FP16_Optimizer`` on a DeepSpeed ZeRO-1/2 optimizer (accelerate's wrapper or the bare
    one), as ORT's recipe has it. ORT swaps in its fused CUDA kernels for the overflow check and
    the gradient norm only when the device is CUDA and DeepSpeed's functions are the ones it
    knows (it compares their source with DeepSpeed 0.9.2's); otherwise it leaves the optimizer
    as it was. Returns None when ORT applied them, else ORT's reason for not doing so."""
    from .extensions import require
    from .runtime import ensure_engine

    ensure_engine()
    if torch.cuda.is_available():
        require("fused_ops")  # ORT's fused overflow check and norm; its build error, not ORT's ImportError
    from onnxruntime.training.optim.fp16_optimizer import FP16_Optimizer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FP16_Optimizer(optimizer)
    messages = [str(w.message) for w in caught]
    if any("overridden with faster implementation" in m for m in messages):
        return None
    skipped = [m for m in messages if m.startswith("Skip modifying optimizer")]
    return skipped[-1].splitlines()[0] if skipped else "ORT's FP16_Optimizer left the optimizer unchanged"
