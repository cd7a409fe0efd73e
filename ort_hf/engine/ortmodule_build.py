"""Building an ORTModule for one model with its ORTOptions, and handing its memory back."""

from __future__ import annotations

import contextlib
import logging
import os
import weakref

from torch import nn

from .options import ORTOptions, environment_for, overridden_by_options, scoped_environ
from .runtime import EngineState

logger = logging.getLogger(__name__)

_WARNED_ENV: set[tuple[str, str, str]] = set()


def build_ort_module(model: nn.Module, options: ORTOptions, state: EngineState) -> nn.Module:
    """An ORTModule around ``model``, constructed under the ``ORTMODULE_*`` variables ``options``
    stand for (the caller's environment restored afterwards)."""
    from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

    set_custom_autograd(state.pythonop_available and options.enable_custom_autograd)
    if options.save_onnx and options.onnx_dir:
        os.makedirs(options.onnx_dir, exist_ok=True)  # ORT refuses a folder that does not exist yet
    debug = DebugOptions(
        log_level=LogLevel[options.log_level],
        save_onnx=options.save_onnx,
        onnx_prefix=type(model).__name__ if options.save_onnx else "",
        save_path=options.onnx_dir or "",
    )
    env = environment_for(options)
    for name, theirs, ours in overridden_by_options(env):
        if (name, theirs, ours) not in _WARNED_ENV:
            _WARNED_ENV.add((name, theirs, ours))
            logger.warning(
                "ort_hf: %s=%s in the environment is overridden by ORTOptions (%s=%s, the "
                "--ort_* arguments): set the option instead.",
                name,
                theirs,
                name,
                ours,
            )
    if options.use_efficient_attention:
        _enable_efficient_attention()
    plan_file = env.get("ORTMODULE_MEMORY_OPT_CONFIG")  # a temp file ORT re-reads at every session build
    try:
        with scoped_environ(env):
            ort_module = ORTModule(model, debug_options=debug)
    except BaseException:
        _remove_file(plan_file)
        raise
    if plan_file:
        weakref.finalize(ort_module, _remove_file, plan_file)  # lives exactly as long as the session
    return ort_module


def set_custom_autograd(enabled: bool) -> None:
    # ORT keeps custom-autograd support as process state, read at export; models wrapped with
    # different settings each get theirs back before their forward.
    from onnxruntime.training.ortmodule import _custom_autograd_function as caf

    if caf.custom_autograd_function_enabler.state != enabled:
        caf.enable_custom_autograd_support(enabled)


def release_freed_memory() -> None:
    """Collect unreachable ORT objects and hand freed heap pages back to the OS (glibc), so the
    process RSS shows what is really in use."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS may keep freed pages, nothing else changes


def _enable_efficient_attention() -> None:
    # ORT registers this graph optimiser only if ORTMODULE_USE_EFFICIENT_ATTENTION=1 when
    # onnxruntime.training.ortmodule is imported (graph_optimizers/__init__.py); importing the
    # module registers it (for CUDA graphs) whenever a model asks for it.
    from onnxruntime.training.ortmodule.graph_optimizers import _aten_attn  # noqa: F401


def _remove_file(path: str | None) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
