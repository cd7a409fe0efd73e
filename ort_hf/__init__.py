"""ort_hf: train Hugging Face models on ONNX Runtime's training engine (ORTModule).

``import ort_hf`` is cheap and works without onnxruntime-training installed; the engine is
brought up on first use, and says which extra to install when it is missing.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "ORTOptions": "ort_hf.engine",
    "wrap_model": "ort_hf.engine",
    "ORTTrainer": "ort_hf.trainer",
    "ORTTrainingArguments": "ort_hf.trainer",
    "ORTTrainerMixin": "ort_hf.trainer",
    "ORTSeq2SeqTrainer": "ort_hf.trainer",
    "ORTSeq2SeqTrainingArguments": "ort_hf.trainer",
    "ModuleWithLoss": "ort_hf.module_with_loss",
    # TRL's trainers (the trl extra); ort_hf.trl says what to install when TRL is missing.
    "ORTSFTTrainer": "ort_hf.trl",
    "ORTSFTConfig": "ort_hf.trl",
    "ORTDPOTrainer": "ort_hf.trl",
    "ORTDPOConfig": "ort_hf.trl",
}

if TYPE_CHECKING:  # the lazy names, for type checkers and IDEs (nothing is imported at run time)
    # ruff: noqa: F401 (each is in __all__, through _LAZY)
    from .engine import ORTOptions, wrap_model
    from .module_with_loss import ModuleWithLoss
    from .trainer import (
        ORTSeq2SeqTrainer,
        ORTSeq2SeqTrainingArguments,
        ORTTrainer,
        ORTTrainerMixin,
        ORTTrainingArguments,
    )
    from .trl import ORTDPOConfig, ORTDPOTrainer, ORTSFTConfig, ORTSFTTrainer


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ort_hf' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
