"""The engine boundary: the only package of ort_hf that talks to onnxruntime.training; the rest of
ort_hf imports from here, never from the modules behind it.

Importing it is cheap; ORTModule is brought up on the first :func:`wrap_model`. Names whose
modules import torch are loaded on first access.
"""

from typing import TYPE_CHECKING

from .errors import EngineUnavailableError, ExtensionBuildError, ORTFallbackError
from .options import SPARSITY_THRESHOLD, ORTOptions
from .runtime import INSTALL_HINT, ensure_engine, is_ort_training_available

# name -> the engine module that defines it (imports torch, or transformers).
_LAZY = {
    "wrap_model": "wrap",
    "ORTTrainingModule": "wrap",
    "EngineStatus": "wrap",
    "BF16_ON_CUDA": "precision",
    "INFERENCE_OPSET": "export",
    "export_inference_onnx": "export",
    "fused_adamw_cls_and_kwargs": "optim",
    "apply_fp16_optimizer": "optim",
    "LoadBalancingBatchSampler": "sampler",
    "trim_trailing_padding": "padding",
    "extension_dir": "extensions",
    "cache_root": "extensions",
    "CACHE_ENV": "extensions",
    "CudaSetup": "cuda",
    "cuda_setup": "cuda",
    "gpu_arch_note": "cuda",
    "provider_library": "cuda",
    "driver_present": "cuda",
    "apply_jit_environment": "cuda_jit",
    "describe_jit_environment": "cuda_jit",
    "first_step_note": "cuda_jit",
    "find_length_constants": "length_check",
    "loss_as_trainer_returns": "compat",
    "first_batch_memo": "check_memo",
    "HeadProducts": "cpu_head_products",
    "ort_product_wanted": "cpu_head_products",
    "ort_input_grad_wanted": "cpu_head_products",
    "ort_weight_grad_wanted": "cpu_head_products",
    "fused_loss_proven": "proven",
}

if TYPE_CHECKING:  # the lazy names, for type checkers and IDEs (nothing is imported at run time)
    # ruff: noqa: F401 (each is in __all__, through _LAZY)
    from .check_memo import first_batch_memo
    from .compat import loss_as_trainer_returns
    from .cpu_head_products import HeadProducts, ort_input_grad_wanted, ort_product_wanted, ort_weight_grad_wanted
    from .cuda import CudaSetup, cuda_setup, driver_present, gpu_arch_note, provider_library
    from .cuda_jit import apply_jit_environment, describe_jit_environment, first_step_note
    from .export import INFERENCE_OPSET, export_inference_onnx
    from .extensions import CACHE_ENV, cache_root, extension_dir
    from .length_check import find_length_constants
    from .optim import apply_fp16_optimizer, fused_adamw_cls_and_kwargs
    from .padding import trim_trailing_padding
    from .precision import BF16_ON_CUDA
    from .proven import fused_loss_proven
    from .sampler import LoadBalancingBatchSampler
    from .wrap import EngineStatus, ORTTrainingModule, wrap_model


__all__ = [
    "EngineUnavailableError",
    "ExtensionBuildError",
    "INSTALL_HINT",
    "ORTFallbackError",
    "ORTOptions",
    "SPARSITY_THRESHOLD",
    "ensure_engine",
    "is_ort_training_available",
    *_LAZY,
]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
