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

For building the CUDA extensions (``torch_gpu_allocator``, ``fused_ops``), :func:`cuda_home`
finds nvcc: ``$CUDA_HOME``, an ``nvcc`` on ``PATH``, or NVIDIA's nvcc wheels (the ``gpu-build``
extra), assembled into a CUDA_HOME in the extension cache.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
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
# ORT 1.19.2's CUDA kernels: SASS for these compute capabilities, PTX for the newest (JIT-compiled
# by the driver on first use for anything newer).
ORT_SASS_ARCHS = ((6, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6))
DEFAULT_BUILD_ARCHS = "8.0;9.0"
NVCC_WHEEL_HINT = ("pip install 'ort_hf[gpu-build]' (NVIDIA's nvcc wheels), or install the CUDA toolkit "
                   "matching torch and set CUDA_HOME")

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


def _already_loaded(soname: str) -> str | None:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if os.path.basename(path) == soname:
                    return path
    except OSError:
        pass
    return None


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


def gpu_archs() -> str:
    """``TORCH_CUDA_ARCH_LIST`` for building: the environment's, the visible GPUs', or sm_80 + sm_90."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    import torch

    if torch.cuda.is_available():
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in caps)
    return DEFAULT_BUILD_ARCHS


def arch_note(capability: tuple[int, int]) -> str:
    """What ORT's kernels mean for a GPU of this compute capability."""
    if capability in ORT_SASS_ARCHS:
        return f"sm_{capability[0]}{capability[1]}: ORT's kernels are compiled for it"
    if capability >= (10, 0):
        return (f"sm_{capability[0]}{capability[1]}: not supported (cuDNN 8, which ORT 1.19.2 needs, has no "
                "Blackwell support)")
    return (f"sm_{capability[0]}{capability[1]}: ORT's kernels are JIT-compiled from PTX on first use (minutes; "
            "raise CUDA_CACHE_MAXSIZE so the driver keeps them)")


def cuda_home(cache: Path) -> Path:
    """A CUDA toolkit root with nvcc and headers for torch's extension builds: ``$CUDA_HOME``,
    the toolkit of the ``nvcc`` on ``PATH``, ``/usr/local/cuda``, else NVIDIA's nvcc wheels."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                  str(Path(nvcc).resolve().parent.parent) if nvcc else None, "/usr/local/cuda"]
    for candidate in candidates:
        if candidate and _is_toolkit(Path(candidate)):
            return Path(candidate)
    return wheel_cuda_home(cache)


def _is_toolkit(home: Path) -> bool:
    return (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists()


def wheel_cuda_home(cache: Path) -> Path:
    """A CUDA_HOME assembled (once, in ``cache``) from NVIDIA's nvcc wheels (the gpu-build extra)."""
    root = _nvidia_root()
    wheel = None
    for folder in ("cu13", "cuda_nvcc"):
        if root is not None and (root / folder / "bin" / "nvcc").exists():
            wheel = root / folder
            break
    if wheel is None:
        raise FileNotFoundError(f"No nvcc to build ORT's CUDA extensions: {NVCC_WHEEL_HINT}.")
    return _assemble_cuda_home(wheel, root, cache)


def _assemble_cuda_home(wheel: Path, root: Path, cache: Path) -> Path:
    """NVIDIA's wheels spread a toolkit over several folders; nvcc finds its root from its own
    path (so bin/ holds real files or hard links, not symlinks), headers and libraries from
    include/ and lib64/."""
    home = cache / f"cuda-home-{_nvcc_version(wheel)}"
    marker = home / ".complete"
    if marker.exists():
        return home
    if home.exists():
        shutil.rmtree(home)
    for folder in ("bin", "include", "lib64", "nvvm"):
        (home / folder).mkdir(parents=True)
    for item in (wheel / "bin").iterdir():
        target = home / "bin" / item.name
        if item.is_dir():
            shutil.copytree(item, target)
        else:
            try:
                os.link(item, target)
            except OSError:
                shutil.copy2(item, target)
    for package in sorted(p for p in root.iterdir() if p.is_dir()):
        for sub, dest in (("include", "include"), ("lib", "lib64"), ("lib64", "lib64"), ("nvvm", "nvvm")):
            src = package / sub
            if src.is_dir() and not (package.name == "cudnn" and sub == "include"):
                for entry in src.iterdir():
                    link = home / dest / entry.name
                    if not link.exists():
                        link.symlink_to(entry)
    # Linkers look for the unversioned name (-lcudart); the wheels ship only libcudart.so.13.
    for lib in (wheel / "lib").glob("lib*.so.*"):
        dev = home / "lib64" / (lib.name.split(".so")[0] + ".so")
        if not dev.exists():
            dev.symlink_to(lib)
    marker.touch()
    return home


def _nvcc_version(wheel: Path) -> str:
    header = wheel / "include" / "cuda.h"
    if header.exists():
        match = re.search(r"#define CUDA_VERSION (\d+)", header.read_text(errors="ignore"))
        if match:
            return match.group(1)
    return "unknown"
