"""Bring ORTModule up once per process: bridges, extensions, symbolics.

Nothing here runs on ``import ort_hf``; the first call to :func:`ensure_engine` (from
``wrap_model`` or ``ort-hf doctor``) does the work and caches the result.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EngineUnavailableError

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "ONNX Runtime training is not installed. Install the extra for your machine: "
    "`pip install 'ort_hf[cpu]'` (onnxruntime-training-cpu==1.19.2) or "
    "`pip install 'ort_hf[gpu]'` (onnxruntime-training==1.19.2, CUDA 11.8). "
    "It has wheels for Python 3.8-3.11 only."
)


@dataclass
class EngineState:
    ortmodule: object
    extensions: dict = field(default_factory=dict)
    pythonop_available: bool = False
    registered_opsets: set = field(default_factory=set)


_state: EngineState | None = None
_lock = threading.Lock()


def is_ort_training_available() -> bool:
    """True when onnxruntime-training is installed. Looks for the package's ``training`` folder
    without importing it: ``import onnxruntime`` validates its build by importing ORTModule, which
    must first happen in :func:`ensure_engine`, with the bridges in place and ORT's custom autograd
    deferred. First imported from here (``find_spec("onnxruntime.training")`` imports
    ``onnxruntime``), ORTModule's module code ran three times in one process and its copies stayed
    alive, each with a pending init exception whose traceback's frames link, calling frame by
    calling frame, to this call's callers: the training loop's model, optimizer and DDP wrapper
    lived as long as the process (``tests/trainer/test_trainer_released.py``)."""
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except ModuleNotFoundError:
        return False
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    return any((Path(folder) / "training" / "__init__.py").is_file() for folder in locations)


def ensure_engine() -> EngineState:
    """Import ORTModule on today's torch and make its extensions available."""
    global _state
    if _state is not None:
        return _state
    with _lock:
        if _state is not None:
            return _state
        if not is_ort_training_available():
            raise EngineUnavailableError(INSTALL_HINT)
        from .._versions import warn_untested

        warn_untested()  # before the C++ extensions are built against whatever torch is installed
        from .cuda_jit import apply_jit_environment

        apply_jit_environment()  # before anything here can initialise CUDA (ORT's import included)
        from . import compat, cpu_kernel_swaps, extensions, model_hooks

        # `import onnxruntime` already imports ORTModule (its build validation does): from here on.
        with compat.without_unused_deepspeed():
            ortmodule = _import_ortmodule(compat)
        compat.apply_ort_bridges()
        cpu_kernel_swaps.register()
        model_hooks.apply_model_hooks()
        statuses = extensions.load_all()
        # ORTModule cannot be built without these (torch_gpu_allocator: wherever torch sees a GPU);
        # fused_ops is required only by what uses it (FusedAdam, FP16_Optimizer).
        for name in ("aten_op_executor", "torch_gpu_allocator"):
            if name in statuses and not statuses[name].loaded:
                extensions.require(name)  # raises the build's own error
        own = statuses.get("ort_hf_cpu_kernels")
        if own is not None and not own.loaded:
            warnings.warn(
                f"ort_hf: its CPU dropout kernels did not build, so ORT's slower serial ones run: {own.error}",
                stacklevel=3,
            )
        pythonop = statuses["torch_interop_utils"].loaded
        if not pythonop:
            warnings.warn(
                "ort_hf: ORT's PythonOp extension is unavailable, so custom autograd functions are "
                f"inlined and label sparsity cannot fire: {statuses['torch_interop_utils'].error}",
                stacklevel=3,
            )
            extensions.install_interop_stand_in()
        # ORT checked for .so files inside its own package at import and recorded a pending
        # init failure; the extensions are now loaded from our cache instead.
        pending = ortmodule._FALLBACK_INIT_EXCEPTION
        if pending is not None and "extensions were not detected" in str(pending):
            ortmodule._FALLBACK_INIT_EXCEPTION = None
            pending.with_traceback(None)  # its frames link to this call's callers
        _state = EngineState(ortmodule=ortmodule, extensions=statuses, pythonop_available=pythonop)
        return _state


def _import_ortmodule(compat):
    from .options import scoped_environ

    compat.apply_torch_bridges()
    from .cuda import load_cuda_libraries

    load_cuda_libraries()  # ORT's CUDA build: its CUDA 11 libraries, before ORT opens the provider
    try:
        # ORT enables custom autograd support while importing, which imports the
        # torch_interop_utils extension that is not built yet; it is enabled per model in
        # wrap_model once the extensions are loaded.
        with scoped_environ({"ORTMODULE_ENABLE_CUSTOM_AUTOGRAD": "0"}):
            import onnxruntime.training.ortmodule as ortmodule
            import onnxruntime.training.utils.hooks  # noqa: F401 - imported at first export otherwise (DeepSpeed)
    except ImportError as exc:
        raise EngineUnavailableError(
            f"onnxruntime.training.ortmodule failed to import ({exc}). {INSTALL_HINT}"
        ) from exc
    return ortmodule


def register_symbolics(state: EngineState, opset_version: int) -> None:
    with _lock:
        if opset_version in state.registered_opsets:
            return
        from .symbolics import register_training_symbolics

        register_training_symbolics(opset_version)
        state.registered_opsets.add(opset_version)
