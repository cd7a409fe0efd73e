"""The engine boundary: the only package of ort_hf that talks to onnxruntime.training.

Importing it is cheap; ORTModule is brought up on the first :func:`wrap_model`.
"""

from .errors import EngineUnavailableError, ExtensionBuildError, ORTFallbackError
from .options import ORTOptions
from .runtime import INSTALL_HINT, is_ort_training_available

__all__ = [
    "BF16_ON_CUDA",
    "EngineStatus",
    "EngineUnavailableError",
    "ExtensionBuildError",
    "INSTALL_HINT",
    "ORTFallbackError",
    "ORTOptions",
    "ORTTrainingModule",
    "is_ort_training_available",
    "wrap_model",
]


def __getattr__(name):
    # wrap.py imports torch; keep `import ort_hf.engine` free of it until needed.
    if name in ("wrap_model", "ORTTrainingModule", "EngineStatus"):
        from . import wrap

        return getattr(wrap, name)
    if name == "BF16_ON_CUDA":
        from .precision import BF16_ON_CUDA

        return BF16_ON_CUDA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
