"""The CUDA driver's module loading and JIT cache for ORT's CUDA provider, and what they mean for
the first step on a GPU.

ORT 1.19.2's CUDA provider carries cubins up to sm_86 (``cuda.ORT_SASS_ARCHS``); on a newer GPU
without a cubin of its major version (Hopper, sm_90) the driver JIT-compiles the provider's
compute_86 PTX. Loaded eagerly, that is every kernel of an 800 MB library when it loads: ONNX
Runtime reports first runs of minutes for it (microsoft/onnxruntime#10746). Two variables of the
driver bound that cost, and ort_hf sets them, unless already set, before it can initialise CUDA
(``ORTTrainingArguments``, ``ensure_engine``, ``ort-hf doctor``):

- ``CUDA_MODULE_LOADING=LAZY``: a kernel is loaded (and its PTX compiled) when first launched,
  so a training step compiles the kernels it runs, not the whole provider.
- ``CUDA_CACHE_MAXSIZE=4294967296`` (4 GiB, the documented maximum): the JIT cache
  (``CUDA_CACHE_PATH``, by default ``~/.nv/ComputeCache``) keeps the compiled kernels for the next
  process instead of evicting them at the default size.

The driver reads both once, at ``cuInit``. When CUDA is already initialised in the process they
cannot take effect, and where a visible GPU needs the JIT ort_hf logs once what to export before
starting Python.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .cuda import DRIVER, ORT_PTX_ARCHS, gpu_arch_note, native_build, provider_library

logger = logging.getLogger(__name__)

JIT_DEFAULTS = {"CUDA_MODULE_LOADING": "LAZY", "CUDA_CACHE_MAXSIZE": str(4 * 1024**3)}
DEFAULT_CACHE_PATH = "~/.nv/ComputeCache"  # the driver's, on Linux, when CUDA_CACHE_PATH is unset
_NOT_INITIALIZED = 3  # CUresult CUDA_ERROR_NOT_INITIALIZED
_LOADING_MODES = {1: "EAGER", 2: "LAZY"}  # CUmoduleLoadingMode


@dataclass(frozen=True)
class JitEnvironment:
    """What ort_hf did with ``JIT_DEFAULTS`` in this process (``ort-hf doctor`` prints it)."""

    set_by_ort_hf: dict[str, str]  # unset before, and CUDA not yet initialised
    given: dict[str, str]  # already in the environment (yours, or torch's LAZY): kept
    warning: str | None = None  # CUDA was initialised first: what to export instead


def decide_jit_environment(
    environ: Mapping[str, str],
    cuda_initialised: bool,
    loading_mode: str | None = None,
    capabilities: tuple[tuple[int, int], ...] = (),
) -> JitEnvironment:
    """What to set, given the environment and whether ``cuInit`` has run in this process; then,
    ``loading_mode`` is the driver's module loading mode (None: unknown) and ``capabilities`` the
    visible GPUs' compute capabilities (empty: unknown)."""
    given = {name: environ[name] for name in JIT_DEFAULTS if name in environ}
    unset = {name: value for name, value in JIT_DEFAULTS.items() if name not in environ}
    if not cuda_initialised:
        return JitEnvironment(set_by_ort_hf=unset, given=given)
    if capabilities and all(native_build(capability) for capability in capabilities):
        return JitEnvironment(set_by_ort_hf={}, given=given)  # native cubins: nothing to JIT-compile, nothing to say
    # torch 2.13 sets CUDA_MODULE_LOADING=LAZY itself when it is unset, in C++ (CUDAHooks::init in
    # aten/src/ATen/cuda/detail/CUDAHooks.cpp, reached from torch.cuda._lazy_init through
    # torch._C._cuda_init; torch/cuda/__init__.py no longer sets it), just before its own first
    # cudaGetDeviceCount. So once torch has initialised CUDA the variable is there, which alone
    # does not say it was read: torch.cuda.is_available() runs cudaGetDeviceCount, hence cuInit,
    # before any _lazy_init, and then torch's LAZY comes too late. The driver's own answer
    # (cuModuleGetLoadingMode) decides; a value other than LAZY in the environment is a choice
    # and is kept.
    missing = dict(unset)
    if loading_mode == "EAGER" and environ.get("CUDA_MODULE_LOADING") == "LAZY":
        missing["CUDA_MODULE_LOADING"] = "LAZY"
    warning = None
    if missing:
        warning = (
            f"ort_hf: CUDA was initialised in this process before ORT's CUDA provider was loaded, so "
            f"{' and '.join(missing)} cannot take effect now (the driver reads them at cuInit); on a GPU "
            "ORT has no cubin for (sm_90), its first step can take minutes. Export them before starting "
            f"Python: export {' '.join(f'{k}={v}' for k, v in missing.items())}"
        )
    return JitEnvironment(set_by_ort_hf={}, given=given, warning=warning)


def driver_state() -> tuple[bool, str | None]:
    """(whether ``cuInit`` has run in this process, the driver's module loading mode or None).
    Before ``cuInit`` the driver API answers CUDA_ERROR_NOT_INITIALIZED and initialises nothing."""
    try:
        driver = ctypes.CDLL(DRIVER)
    except OSError:
        return False, None
    count = ctypes.c_int()
    if driver.cuDeviceGetCount(ctypes.byref(count)) == _NOT_INITIALIZED:
        return False, None
    mode = ctypes.c_int()
    get_mode = getattr(driver, "cuModuleGetLoadingMode", None)  # drivers for CUDA 11.7 and newer
    if get_mode is None or get_mode(ctypes.byref(mode)) != 0:
        return True, None
    return True, _LOADING_MODES.get(mode.value)


_applied: JitEnvironment | None = None


def apply_jit_environment() -> JitEnvironment | None:
    """Set ``JIT_DEFAULTS`` where unset, once per process, before ORT's CUDA provider loads; None
    (and nothing set) for ORT's CPU build."""
    global _applied
    if _applied is None and provider_library() is not None:
        import torch

        initialised, mode = driver_state()
        initialised = initialised or torch.cuda.is_initialized()
        capabilities = ()
        if initialised:  # asking costs no cuInit now
            capabilities = tuple(torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))
        _applied = decide_jit_environment(os.environ, initialised, mode, capabilities)
        os.environ.update(_applied.set_by_ort_hf)
        if _applied.warning:
            logger.warning(_applied.warning)
    return _applied


def describe_jit_environment(jit: JitEnvironment) -> str:
    """One line: each variable, its value, and whose it is."""
    parts = [f"{k}={v} (set by ort_hf)" for k, v in jit.set_by_ort_hf.items()]
    parts += [f"{k}={v} (already set: kept)" for k, v in jit.given.items()]
    return ", ".join(parts) + (" -- too late for this process: CUDA was already initialised" if jit.warning else "")


def first_step_note(capability: tuple[int, int], seconds: float, environ: Mapping[str, str]) -> str:
    """How long the first CUDA step took and why, for a GPU of this compute capability."""
    head = f"first step {seconds:.1f} s"
    native = native_build(capability)
    if native:
        return f"{head}: native cubins (ORT's sm_{native[0]}{native[1]} build), nothing to JIT-compile"
    if capability >= (10, 0):
        return f"{head}: {gpu_arch_note(capability)}"
    ptx = max(ORT_PTX_ARCHS)
    which = (
        "the kernels it ran (CUDA_MODULE_LOADING=LAZY)"
        if environ.get("CUDA_MODULE_LOADING") == "LAZY"
        else "every kernel of the provider (eager module loading)"
    )
    if environ.get("CUDA_CACHE_DISABLE") == "1":
        cache = "the JIT cache is off (CUDA_CACHE_DISABLE=1), so every process compiles them again"
    else:
        size = environ.get("CUDA_CACHE_MAXSIZE", "the driver's default")
        cache = (
            f"the JIT cache (CUDA_CACHE_MAXSIZE={size}, {environ.get('CUDA_CACHE_PATH', DEFAULT_CACHE_PATH)}) "
            "keeps them for the next run"
        )
    return (
        f"{head}: this GPU's sm_{capability[0]}{capability[1]} has no ORT cubin, so the driver JIT-compiled "
        f"ORT's compute_{ptx[0]}{ptx[1]} PTX for {which}, or read them from its JIT cache; {cache}"
    )
