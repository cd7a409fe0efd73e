"""What ORT's CUDA build needs at run time and build time, found and loaded by the engine.

onnxruntime-training 1.19.2's CUDA provider (``onnxruntime/capi/libonnxruntime_providers_cuda.so``)
is linked against CUDA 11.8 / cuDNN 8, while torch 2.13 from the registry is built for CUDA 13.
The ``gpu`` extra installs NVIDIA's CUDA 11 runtime wheels (``nvidia-*-cu11``, pinned in
pyproject.toml); :func:`load_cuda_libraries` loads them by full path, in dependency order and
globally, before ORT opens its provider, so the provider's dependencies resolve by soname without
``LD_LIBRARY_PATH``. ``libcurand.so.10`` is the soname of both CUDA 11.8's and CUDA 13's cuRAND:
whichever is loaded first serves torch and ORT; :func:`library_sources` says which one that is.

ORT aborts the whole process (``CUDADriverWrapper() handle != nullptr``) when it creates a CUDA
session on a machine without the NVIDIA driver (``libcuda.so.1``): :func:`require_driver` turns
that into an error before any CUDA session is built.

The toolkit that builds ORT's CUDA extensions is found by ``cuda_toolkit.py``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

DRIVER = "libcuda.so.1"
# (soname, folder of its wheel under site-packages/nvidia), in dependency order.
CUDA11_LIBRARIES = (
    ("libcudart.so.11.0", "cuda_runtime"),
    ("libnvrtc.so.11.2", "cuda_nvrtc"),
    ("libcublasLt.so.11", "cublas"),
    ("libcublas.so.11", "cublas"),
    ("libcurand.so.10", "curand"),
    ("libcufft.so.10", "cufft"),
    ("libcudnn_ops_infer.so.8", "cudnn"),
    ("libcudnn_ops_train.so.8", "cudnn"),
    ("libcudnn_cnn_infer.so.8", "cudnn"),
    ("libcudnn_cnn_train.so.8", "cudnn"),
    ("libcudnn_adv_infer.so.8", "cudnn"),
    ("libcudnn_adv_train.so.8", "cudnn"),
    ("libcudnn.so.8", "cudnn"),
)
# What onnxruntime-training 1.19.2's libonnxruntime_providers_cuda.so carries, read from the binary
# by `make gpu-check` (cuobjdump --list-elf / --list-ptx), which fails if it ever reads otherwise:
# SASS (cubins) for these compute capabilities, and PTX for the same ones.
ORT_SASS_ARCHS = ((6, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6))
ORT_PTX_ARCHS = ORT_SASS_ARCHS

_loaded: dict[str, str] = {}


def provider_library() -> Path | None:
    """ORT's CUDA provider library, or None for the CPU build."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "capi" / "libonnxruntime_providers_cuda.so"
    return path if path.exists() else None


def _nvidia_root() -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def driver_present() -> bool:
    try:
        ctypes.CDLL(DRIVER)
        return True
    except OSError:
        return False


def require_driver() -> None:
    if not driver_present():
        raise RuntimeError(
            f"ORT was asked for a CUDA session, but this machine has no NVIDIA driver ({DRIVER} does not load). "
            "ORT would abort the process: train on CPU (model and batches on the CPU), or install the driver."
        )


def torch_uses_tf32() -> bool:
    """Whether torch runs fp32 on CUDA in TF32, as ORT's CUDA provider option ``use_tf32`` means it.

    ORT's ``use_tf32`` (default true) is one switch for cuBLAS fp32 GEMMs and cuDNN convolutions
    (on Ampere and newer); torch 2.13 keeps matmuls in IEEE fp32 by default and convolutions in
    TF32. ORT follows torch where they agree and stays in IEEE fp32 where they do not. Read through
    torch's ``fp32_precision`` settings: the legacy ``allow_tf32`` / ``get_float32_matmul_precision``
    views raise once the new API has been used, and ``set_float32_matmul_precision`` /
    ``allow_tf32 = True`` are reflected here as well."""
    import torch

    return torch.backends.cuda.matmul.fp32_precision == "tf32" and torch.backends.cudnn.conv.fp32_precision == "tf32"


class _LinkMap(ctypes.Structure):  # the head of glibc's struct link_map (<link.h>)
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


_RTLD_NOLOAD, _RTLD_DI_LINKMAP = 0x4, 2


def _already_loaded(soname: str) -> str | None:
    """The file a lookup of ``soname`` resolves to in this process, or None when none is loaded.

    ``dlopen(soname, RTLD_NOLOAD)`` asks the dynamic loader the question it answers for ORT's
    provider library: among loaded objects, the first in load order whose name or soname
    matches (two files of one soname can be loaded; their addresses say nothing of the order)."""
    libc = ctypes.CDLL(None)
    libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    handle = libc.dlopen(soname.encode(), _RTLD_NOLOAD | os.RTLD_LAZY)
    if not handle:
        return None
    try:
        dlinfo = getattr(libc, "dlinfo", None) or ctypes.CDLL("libdl.so.2").dlinfo  # in libc since glibc 2.34
        dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        link_map = ctypes.POINTER(_LinkMap)()
        if dlinfo(ctypes.c_void_p(handle), _RTLD_DI_LINKMAP, ctypes.byref(link_map)) != 0:
            return None
        return os.fsdecode(link_map.contents.l_name)
    finally:
        libc.dlclose.argtypes = [ctypes.c_void_p]
        libc.dlclose(ctypes.c_void_p(handle))  # the reference RTLD_NOLOAD took


def load_cuda_libraries() -> dict[str, str]:
    """Load ORT's CUDA 11 dependencies from the ``nvidia-*-cu11`` wheels; returns soname -> path
    (or why it was not loaded). A no-op for ORT's CPU build."""
    if _loaded or provider_library() is None:
        return dict(_loaded)
    root = _nvidia_root()
    for soname, folder in CUDA11_LIBRARIES:
        present = _already_loaded(soname)
        if present:
            _loaded[soname] = present  # e.g. torch's CUDA 13 cuRAND: the same soname serves both
            continue
        path = root / folder / "lib" / soname if root is not None else None
        if path is None or not path.exists():
            _loaded[soname] = "missing: install the gpu extra (pip install 'ort_hf[gpu]')"
            continue
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            _loaded[soname] = str(path)
        except OSError as exc:
            _loaded[soname] = f"failed to load: {exc}"
    return dict(_loaded)


def library_sources() -> dict[str, str]:
    """Where each library of ORT's CUDA provider was resolved from (after :func:`load_cuda_libraries`)."""
    return dict(_loaded)


def check_provider_links() -> str | None:
    """Load ORT's CUDA provider library; returns None when every dependency resolves, else why not.

    Loading it constructs ORT's driver wrapper, which aborts the process without a driver: so
    this refuses (raises) where :func:`driver_present` is False."""
    provider = provider_library()
    if provider is None:
        return "onnxruntime-training is the CPU build (no CUDA provider)"
    require_driver()
    load_cuda_libraries()
    try:
        ctypes.CDLL(str(provider), mode=ctypes.RTLD_GLOBAL)
        return None
    except OSError as exc:
        return str(exc)


@dataclass(frozen=True)
class CudaSetup:
    """What this machine offers ORT's CUDA build, as far as it could be looked at: nothing past a
    missing provider or driver (``ort-hf doctor`` prints it)."""

    provider_installed: bool  # the gpu extra's onnxruntime-training, with its CUDA provider
    driver_present: bool = False
    driver_cuda_version: str | None = None  # the newest CUDA the driver supports, e.g. "12.8"
    provider_problem: str | None = None  # why ORT's CUDA provider does not load (None: it loads)
    library_sources: dict[str, str] = field(default_factory=dict)  # soname -> where it was loaded from


def cuda_setup() -> CudaSetup:
    """Look at the provider, the driver, and whether the provider's libraries load."""
    if provider_library() is None:
        return CudaSetup(provider_installed=False)
    if not driver_present():
        return CudaSetup(provider_installed=True)
    version = ctypes.c_int()
    ctypes.CDLL(DRIVER).cuDriverGetVersion(ctypes.byref(version))
    problem = check_provider_links()
    return CudaSetup(
        provider_installed=True,
        driver_present=True,
        driver_cuda_version=f"{version.value // 1000}.{version.value % 1000 // 10}",
        provider_problem=problem,
        library_sources=library_sources(),
    )


def native_build(capability: tuple[int, int]) -> tuple[int, int] | None:
    """The ORT cubin (``ORT_SASS_ARCHS``) a GPU of this compute capability runs, or None when the
    driver must JIT-compile PTX instead. A cubin runs on GPUs of its major version and a minor at
    least its own."""
    runs = [arch for arch in ORT_SASS_ARCHS if arch[0] == capability[0] and arch[1] <= capability[1]]
    return runs[-1] if runs else None


def gpu_arch_note(capability: tuple[int, int]) -> str:
    """What ORT's kernels (``ORT_SASS_ARCHS`` / ``ORT_PTX_ARCHS``) mean for a GPU of this compute
    capability."""
    name = f"sm_{capability[0]}{capability[1]}"
    native = native_build(capability)
    if native:
        built = f"sm_{native[0]}{native[1]}"
        return f"{name}: ORT's kernels run from their {built} build" + ("" if built == name else " (same major)")
    if capability >= (10, 0):
        return f"{name}: not supported (cuDNN 8, which ORT 1.19.2 needs, has no Blackwell support)"
    newest = max(ORT_PTX_ARCHS)
    return (
        f"{name}: ORT carries no build for it; the driver JIT-compiles its compute_{newest[0]}{newest[1]} PTX "
        "on first use (minutes; the driver's JIT cache keeps the result for later runs)"
    )
