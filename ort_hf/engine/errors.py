"""Errors raised by the engine boundary. Each message says what to change."""


class EngineUnavailableError(ImportError):
    """onnxruntime-training (ORTModule) cannot be imported in this environment."""


class ExtensionBuildError(RuntimeError):
    """One of ORTModule's torch C++ extensions could not be built or loaded."""


class ORTFallbackError(RuntimeError):
    """ORT could not run the model and fallback to PyTorch is disabled."""
