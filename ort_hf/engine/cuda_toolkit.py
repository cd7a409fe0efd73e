"""The CUDA toolkit (nvcc, headers) that builds ORT's CUDA extensions, and for which GPUs.

ORT's ``torch_gpu_allocator`` and ``fused_ops`` are torch extensions: they must be compiled by a
toolkit of the same CUDA major version as torch itself (torch 2.13 from the registry: CUDA 13),
or torch's build refuses them, or worse, they link against the wrong runtime. A machine often
has another toolkit installed (``/usr/local/cuda`` at 12.x, say), so every candidate is checked:
``$CUDA_HOME``, ``$CUDA_PATH``, the ``nvcc`` on ``PATH``, ``/usr/local/cuda``, then NVIDIA's
nvcc wheels (the ``gpu-build`` extra), assembled into a CUDA_HOME in the extension cache. The
first whose major version equals ``torch.version.cuda``'s builds; :func:`find_toolkit` says
which one and why the others were passed over.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .cuda import _nvidia_root
from .errors import ExtensionBuildError

DEFAULT_BUILD_ARCHS = "8.0;9.0"
SYSTEM_TOOLKIT = "/usr/local/cuda"
NVCC_WHEEL_HINT = (
    "pip install 'ort_hf[gpu-build]' (NVIDIA's nvcc wheels for torch's CUDA), or install the CUDA "
    "toolkit of torch's CUDA major version and set CUDA_HOME to it"
)


@dataclass(frozen=True)
class Toolkit:
    home: Path
    version: str  # "13.0"
    source: str  # where it was found, for messages
    passed_over: tuple[str, ...] = ()  # candidates of another CUDA version, and why

    @property
    def nvcc(self) -> Path:
        return self.home / "bin" / "nvcc"

    def describe(self) -> str:
        said = f"nvcc of CUDA {self.version} from {self.source} ({self.home})"
        return said + (f"; passed over: {'; '.join(self.passed_over)}" if self.passed_over else "")


def gpu_archs() -> str:
    """``TORCH_CUDA_ARCH_LIST`` for building: the environment's, the visible GPUs', or sm_80 + sm_90."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    import torch

    if torch.cuda.is_available():
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in caps)
    return DEFAULT_BUILD_ARCHS


def toolkit_version(home: Path) -> str | None:
    """ "13.0" from the toolkit's ``cuda.h``, or None where ``home`` is not a toolkit with nvcc."""
    header = home / "include" / "cuda.h"
    if not ((home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists() and header.exists()):
        return None
    match = re.search(r"#define CUDA_VERSION (\d+)", header.read_text(errors="ignore"))
    if match is None:
        return None
    number = int(match.group(1))
    return f"{number // 1000}.{number % 1000 // 10}"


def find_toolkit(cache: Path, torch_cuda: str) -> Toolkit:
    """The first toolkit whose CUDA major version is ``torch_cuda``'s (see the module docstring);
    raises ``ExtensionBuildError`` naming every candidate when none is."""
    nvcc = shutil.which("nvcc")
    candidates = [
        ("$CUDA_HOME", os.environ.get("CUDA_HOME")),
        ("$CUDA_PATH", os.environ.get("CUDA_PATH")),
        ("the nvcc on PATH", str(Path(nvcc).resolve().parent.parent) if nvcc else None),
        (SYSTEM_TOOLKIT, SYSTEM_TOOLKIT),
    ]
    wanted = torch_cuda.split(".")[0]
    passed_over: list[str] = []
    seen: set[Path] = set()
    for source, folder in candidates:
        if not folder or Path(folder).resolve() in seen:
            continue
        seen.add(Path(folder).resolve())
        version = toolkit_version(Path(folder))
        if version is None:
            continue
        if version.split(".")[0] == wanted:
            return Toolkit(Path(folder), version, source, tuple(passed_over))
        passed_over.append(f"{source} ({folder}) is CUDA {version}")
    wheel = wheel_nvcc_root()
    if wheel is not None:
        version = toolkit_version(wheel) or "unknown"
        if version.split(".")[0] == wanted:
            return Toolkit(
                _assemble_cuda_home(wheel, wheel.parent, cache, version),
                version,
                "NVIDIA's nvcc wheels (gpu-build extra)",
                tuple(passed_over),
            )
        passed_over.append(f"NVIDIA's nvcc wheels ({wheel}) are CUDA {version}")
    found = "; ".join(passed_over) if passed_over else "no CUDA toolkit with nvcc was found"
    raise ExtensionBuildError(
        f"No CUDA toolkit of torch's CUDA major version ({torch_cuda}) to build ORT's CUDA extensions: {found}. "
        f"{NVCC_WHEEL_HINT}."
    )


def wheel_nvcc_root() -> Path | None:
    """The folder of NVIDIA's nvcc wheel (``bin/nvcc``, and ``bin/cuobjdump`` with its wheel), or
    None when the ``gpu-build`` extra is not installed."""
    root = _nvidia_root()
    for folder in ("cu13", "cuda_nvcc"):
        if root is not None and (root / folder / "bin" / "nvcc").exists():
            return root / folder
    return None


def wheel_cuda_home(cache: Path) -> Path:
    """The CUDA_HOME assembled from NVIDIA's nvcc wheels (the gpu-build extra)."""
    wheel = wheel_nvcc_root()
    if wheel is None:
        raise ExtensionBuildError(f"No nvcc wheels installed: {NVCC_WHEEL_HINT}.")
    return _assemble_cuda_home(wheel, wheel.parent, cache, toolkit_version(wheel) or "unknown")


def _assemble_cuda_home(wheel: Path, root: Path, cache: Path, version: str) -> Path:
    """NVIDIA's wheels spread a toolkit over several folders; nvcc finds its root from its own
    path (so bin/ holds real files or hard links, not symlinks), headers and libraries from
    include/ and lib64/."""
    home = cache / f"cuda-home-{version}"
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
            # cudnn: nvidia-cudnn-cu11 (ORT's) overwrites cuDNN 9's headers with cuDNN 8's.
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
