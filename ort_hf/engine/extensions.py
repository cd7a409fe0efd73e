"""Build, cache and load ORTModule's torch C++ extensions outside site-packages.

ORTModule expects ``aten_op_executor`` and ``torch_interop_utils`` as compiled modules inside
its own package folder, built by ``python -m onnxruntime.training.ortmodule.torch_cpp_extensions.install``.
That folder may be read-only, the install aborts at the first failure, and
``torch_interop_utils`` does not compile on current torch as shipped. Here each extension is
built once per (extension, torch version, C++ ABI, ORT version, python) into a user cache
directory, under a file lock so concurrent processes never build at once, and then
registered in ``sys.modules`` under the name ORTModule imports.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._paths import probe_writable
from . import cuda_toolkit, trust
from .errors import ExtensionBuildError

logger = logging.getLogger(__name__)

ORT_EXTENSION_PACKAGE = "onnxruntime.training.ortmodule.torch_cpp_extensions"
CPU_EXTENSIONS = ("aten_op_executor", "torch_interop_utils")
# Needed where torch sees a GPU: ORTModule imports torch_gpu_allocator when it builds a CUDA
# session, ORT's FusedAdam (--optim adamw_ort_fused) imports fused_ops.
CUDA_EXTENSIONS = ("torch_gpu_allocator", "fused_ops")
# ort_hf's own kernels (sources in csrc/), loaded as torch operator libraries: ORT's ATen node
# runs them through torch's dispatcher (engine/cpu_kernel_swaps.py).
OWN_EXTENSIONS = ("ort_hf_cpu_kernels",)
_OWN_SOURCES = Path(__file__).parent / "csrc"
EXTENSIONS = CPU_EXTENSIONS + CUDA_EXTENSIONS + OWN_EXTENSIONS
CACHE_ENV = "ORT_HF_CACHE_DIR"


@dataclass(frozen=True)
class ExtensionStatus:
    name: str
    loaded: bool
    path: Path | None
    error: str | None = None


_status: dict[str, ExtensionStatus] = {}


def cache_root() -> Path:
    """The user cache dir for built extensions (``$ORT_HF_CACHE_DIR`` overrides it)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("ort_hf"))


def _build_key() -> str:
    import onnxruntime
    import torch

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"torch{torch.__version__}-abi{abi}-ort{onnxruntime.__version__}-{py}"


def _writable_dir(preferred: Path) -> Path:
    """``preferred`` if it can be written; otherwise a temp dir, with a warning saying why."""
    try:
        probe_writable(preferred)
        return preferred
    except OSError as exc:
        # A predictable /tmp path: used only while nobody else owns or can write it.
        fallback = trust.trusted_dir(
            Path(tempfile.gettempdir()) / f"ort_hf-{os.getuid()}" / preferred.name,
            "ORT's compiled extensions",
            f"${CACHE_ENV}",
        )
        warnings.warn(
            f"ort_hf: cache dir {preferred} is not writable ({exc.strerror}); building ORT "
            f"extensions in {fallback} instead. Set {CACHE_ENV} to a writable directory to keep them.",
            stacklevel=3,
        )
        return fallback


_chosen_dirs: dict[Path, Path] = {}


def extension_dir() -> Path:
    """The folder extensions are built into and loaded from: the cache's, when it is private to
    this user (``trust``) and writable; otherwise one private folder for this process."""
    wanted = cache_root() / "extensions" / _build_key()
    if wanted not in _chosen_dirs:
        trusted = trust.trusted_dir(wanted, "ORT's compiled extensions", f"${CACHE_ENV}")
        _chosen_dirs[wanted] = _writable_dir(trusted)
    return _chosen_dirs[wanted]


def _ort_sources(name: str) -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    assert spec is not None and spec.origin is not None
    kind = "cuda" if name in CUDA_EXTENSIONS else "cpu"
    root = Path(spec.origin).parent / "training" / "ortmodule" / "torch_cpp_extensions" / kind / name
    if not root.is_dir():
        raise ExtensionBuildError(f"ORT's sources for {name} are missing from {root}: reinstall onnxruntime-training.")
    return root


def _check_toolchain() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        raise ExtensionBuildError(
            "No C++ compiler found to build ORTModule's extensions: install g++ "
            "(Debian/Ubuntu: apt-get install g++) or set CXX."
        )
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.exists():
        raise ExtensionBuildError(
            f"Python headers are missing ({include}): install the python3-dev package for this Python."
        )
    if shutil.which("ninja") is None:
        raise ExtensionBuildError("ninja is needed to build ORTModule's extensions: pip install ninja.")


def _prepare_sources(name: str, workdir: Path) -> list[Path]:
    """Copy ORT's sources (or ours) into ``workdir`` and apply our port where one is needed; returns
    every file copied (the sources to compile and the headers they include)."""
    src = _OWN_SOURCES if name in OWN_EXTENSIONS else _ort_sources(name)
    dest = workdir / "src"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    if name == "torch_gpu_allocator":
        # ORT's setup.py fills these in for CUDA or ROCm before compiling.
        source = dest / "torch_gpu_allocator.cc"
        source.write_text(
            source.read_text()
            .replace("___gpu_identifier___", "cuda")
            .replace("___gpu_allocator_header___", "CUDACachingAllocator")
        )
    from .extension_ports import apply_port

    apply_port(name, dest)
    return sorted(p for p in dest.iterdir() if p.is_file())


_CFLAGS = ["-O3", "-std=c++17"]  # as ORT's own setup.py builds them


def _cflags(name: str) -> list[str]:
    # ours use at::parallel_for, i.e. OpenMP: the library then needs libgomp.so.1, which the
    # loader resolves to the copy torch already loaded, so both share one thread pool.
    return _CFLAGS + (["-fopenmp", *_dispatch_stub_flags()] if name in OWN_EXTENSIONS else [])


# The CPU capabilities a torch build may compile its kernels for beside the default, per machine:
# each adds pointers to the entry point of its dispatch stubs (ATen/native/DispatchStub.h declares
# them under HAVE_<capability>_CPU_DEFINITION, which torch's own build defines, not an extension's).
_STUB_CAPABILITIES = {"x86_64": (("AVX512", 1), ("AVX2", 1)), "aarch64": (("SVE", 2),)}
_GET_CALL_PTR = "_ZN2at6native16DispatchStubImpl12get_call_ptrEN3c1010DeviceTypeEPv"  # then one S4_ a pointer more


@functools.cache
def _dispatch_stub_flags() -> tuple[str, ...]:
    """The flags under which a kernel of ours may call one of torch's dispatch stubs (as
    cpu_flash_attention.cpp does): the capabilities whose entry point this torch exports, found by
    the entry point's mangled name, and ``ORT_HF_DISPATCH_STUBS``; none where neither name is found
    (the kernel then calls torch's operator)."""
    import ctypes
    import platform

    import torch

    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    except OSError:  # not a Linux wheel's layout
        return ()
    for capabilities in (_STUB_CAPABILITIES.get(platform.machine(), ()), ()):
        pointers = sum(count for _, count in capabilities)
        if hasattr(library, _GET_CALL_PTR + "S4_" * pointers):
            return (*(f"-DHAVE_{name}_CPU_DEFINITION" for name, _ in capabilities), "-DORT_HF_DISPATCH_STUBS")
    return ()


def _digest(paths: list[Path], cflags: list[str], archs: str = "") -> str:
    h = hashlib.sha256(" ".join(cflags + [archs]).encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def build_extension(name: str, verbose: bool = False):
    """Build (or reuse) one extension and return the loaded Python module.

    The build folder is named after a digest of the (ported) sources, their headers and the flags,
    so a changed port or ORT source is rebuilt, and a finished build is reused across processes.
    """
    import filelock
    from torch.utils import cpp_extension

    base = extension_dir()
    workdir = base / name
    workdir.mkdir(parents=True, exist_ok=True)
    is_cuda = name in CUDA_EXTENSIONS
    with filelock.FileLock(str(base / f"{name}.lock")):
        prepared = _prepare_sources(name, workdir)
        sources = [p for p in prepared if p.suffix in (".cc", ".cpp", ".cu")]
        archs = _cuda_archs() if is_cuda else ""
        build_dir = workdir / f"build-{_digest(prepared, _cflags(name), archs)}"
        built = build_dir / f"{name}.so"
        if built.exists():
            if trust.verified(built):
                return _load_so(name, built)
            logger.warning(
                "ort_hf: %s does not match the hash recorded when it was built (or none was); not "
                "loading it, rebuilding.",
                built,
            )
            shutil.rmtree(build_dir)
        _check_toolchain()
        build_dir.mkdir(exist_ok=True)
        # torch's own build baton: a build killed mid-way leaves it, and every later build then
        # waits on it forever. Under our lock no other build of this extension can be running.
        (build_dir / "lock").unlink(missing_ok=True)
        toolkit = _cuda_toolkit(base) if is_cuda else None
        compilers = os.environ.get("CXX", "c++") + (f" and {toolkit.describe()}" if toolkit else "")
        print(
            f"ort_hf: building ORTModule extension {name} with {compilers} (once per torch/ORT version, 1-5 min)...",
            file=sys.stderr,
        )
        try:
            with _cuda_build_environment(toolkit, archs) if toolkit else contextlib.nullcontext():
                cpp_extension.load(
                    name=name,
                    sources=[str(s) for s in sources],
                    extra_cflags=_cflags(name),
                    extra_ldflags=["-fopenmp"] if name in OWN_EXTENSIONS else None,
                    extra_cuda_cflags=["-O3"] if is_cuda else None,
                    extra_include_paths=[str(workdir / "src")],
                    build_directory=str(build_dir),
                    with_cuda=is_cuda,
                    is_python_module=name not in OWN_EXTENSIONS,
                    is_standalone=False,
                    verbose=verbose,
                )
        except Exception as exc:  # compiler errors arrive as RuntimeError/subprocess errors
            import torch

            needs = (
                f"for sm {archs}; if the toolkit is at fault: {cuda_toolkit.NVCC_WHEEL_HINT}"
                if is_cuda
                else "it needs a C++17 g++, Python headers and ninja"
            )
            raise ExtensionBuildError(
                f"Building ORTModule's {name} extension with {compilers} against torch {torch.__version__} "
                f"failed ({needs}). The build said:\n{_build_output(exc)}\nBuild files: {build_dir}. "
                "Run `ort-hf doctor` for the toolchain check."
            ) from exc
        if not built.exists():
            raise ExtensionBuildError(f"Building {name} produced no shared library at {built}.")
        trust.record(built)
        return _load_so(name, built)


def _build_output(exc: BaseException, limit: int = 3000) -> str:
    """The compiler's own words: torch's loader raises with the build log in its message; its
    error lines first, then the log's end."""
    log = str(exc)
    errors = list(dict.fromkeys(line.strip() for line in log.splitlines() if "error" in line.lower()))[:8]
    tail = log if len(log) <= limit else "...\n" + log[-limit:]
    return "\n".join(errors) + ("\n--- end of the build log ---\n" if errors else "") + tail


def _cuda_archs() -> str:
    import torch

    if torch.version.cuda is None:
        raise ExtensionBuildError(
            f"torch {torch.__version__} is a CPU build: ORT's CUDA extensions need torch's "
            "CUDA build (pip install torch==2.13.0 from the default index)."
        )
    return cuda_toolkit.gpu_archs()


def _cuda_toolkit(base: Path) -> cuda_toolkit.Toolkit:
    import torch

    return cuda_toolkit.find_toolkit(base, torch.version.cuda)


@contextlib.contextmanager
def _cuda_build_environment(toolkit: cuda_toolkit.Toolkit, archs: str):
    """CUDA_HOME and TORCH_CUDA_ARCH_LIST for one build."""
    from torch.utils import cpp_extension

    saved_env = {k: os.environ.get(k) for k in ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST")}
    saved_home = cpp_extension.CUDA_HOME  # read by torch once, at import
    os.environ.update(CUDA_HOME=str(toolkit.home), TORCH_CUDA_ARCH_LIST=archs)
    cpp_extension.CUDA_HOME = str(toolkit.home)
    try:
        yield
    finally:
        cpp_extension.CUDA_HOME = saved_home
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _load_so(name: str, so: Path):
    if name in OWN_EXTENSIONS:
        return _load_operator_library(name, so)
    qualified = f"{ORT_EXTENSION_PACKAGE}.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise ExtensionBuildError(
            f"The built {name} at {so} does not load: {exc}. Delete {so.parent} to rebuild."
        ) from exc
    sys.modules[qualified] = module
    package = sys.modules.get(ORT_EXTENSION_PACKAGE)
    if package is not None:
        setattr(package, name, module)
    _status[name] = ExtensionStatus(name, True, so)
    return module


def _load_operator_library(name: str, so: Path):
    """Load one of our own extensions: it registers its operators with torch (``torch.ops.ort_hf``)."""
    import torch

    if name not in _status or not _status[name].loaded:
        try:
            torch.ops.load_library(str(so))
        except OSError as exc:
            raise ExtensionBuildError(
                f"The built {name} at {so} does not load: {exc}. Delete {so.parent} to rebuild."
            ) from exc
        _status[name] = ExtensionStatus(name, True, so)
    return torch.ops.ort_hf


def needed_here() -> tuple[str, ...]:
    """The extensions ORTModule imports on this machine: where torch sees a GPU, ORTModule
    imports ``torch_gpu_allocator`` whenever it is constructed (GraphExecutionManager.__init__),
    and ORT's FusedAdam imports ``fused_ops``; ort_hf's own CPU kernels everywhere (a CPU graph
    can be built on a GPU machine too)."""
    import torch

    return EXTENSIONS if torch.cuda.is_available() else CPU_EXTENSIONS + OWN_EXTENSIONS


def load_all() -> dict[str, ExtensionStatus]:
    """Build/load every extension :func:`needed_here`; failures are recorded (see :func:`require`)."""
    for name in needed_here():
        if name in _status and _status[name].loaded:
            continue
        try:
            build_extension(name)
        except ExtensionBuildError as exc:
            _status[name] = ExtensionStatus(name, False, None, str(exc))
    return dict(_status)


def require(name: str):
    """The loaded extension ``name``; its recorded build error (the compiler's own words) when
    it failed, instead of the bare ImportError ORT would raise when it imports it."""
    status = _status.get(name)
    if status is None or not status.loaded:
        if status is not None and status.error:
            raise ExtensionBuildError(status.error)
        return build_extension(name)
    return sys.modules[f"{ORT_EXTENSION_PACKAGE}.{name}"]


def install_interop_stand_in() -> None:
    """Without a working torch_interop_utils, ORT still imports it when custom autograd is
    requested; a stand-in module lets ORT run with custom functions inlined at export."""
    import types

    qualified = f"{ORT_EXTENSION_PACKAGE}.torch_interop_utils"
    if qualified not in sys.modules:
        sys.modules[qualified] = types.ModuleType("torch_interop_utils")
