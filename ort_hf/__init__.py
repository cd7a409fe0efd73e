"""ort_hf: train Hugging Face models on ONNX Runtime's training engine (ORTModule).

``import ort_hf`` is cheap and works without onnxruntime-training installed; the engine is
brought up on first use, and says which extra to install when it is missing.
"""

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


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ort_hf' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
