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
from .errors import ExtensionBuildError

logger = logging.getLogger(__name__)

ORT_EXTENSION_PACKAGE = "onnxruntime.training.ortmodule.torch_cpp_extensions"
EXTENSIONS = ("aten_op_executor", "torch_interop_utils")
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
        fallback = Path(tempfile.gettempdir()) / f"ort_hf-{os.getuid()}" / preferred.name
        fallback.mkdir(parents=True, exist_ok=True)
        warnings.warn(
            f"ort_hf: cache dir {preferred} is not writable ({exc.strerror}); building ORT "
            f"extensions in {fallback} instead. Set {CACHE_ENV} to a writable directory to keep them.",
            stacklevel=3,
        )
        return fallback


def extension_dir() -> Path:
    return _writable_dir(cache_root() / "extensions" / _build_key())


def _ort_sources(name: str) -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent / "training" / "ortmodule" / "torch_cpp_extensions" / "cpu" / name
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
    """Copy ORT's sources into ``workdir`` and apply our port where one is needed."""
    src = _ort_sources(name)
    dest = workdir / "src"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    if name == "torch_interop_utils":
        from .interop_port import apply_port

        apply_port(dest)
    return sorted(dest.glob("*.cc"))


_CFLAGS = ["-O3", "-std=c++17"]  # as ORT's own setup.py builds them


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256(" ".join(_CFLAGS).encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def build_extension(name: str, verbose: bool = False):
    """Build (or reuse) one extension and return the loaded Python module.

    The build folder is named after a digest of the (ported) sources and flags, so a changed
    port or ORT source is rebuilt, and a finished build is reused across processes.
    """
    import filelock
    from torch.utils import cpp_extension

    base = extension_dir()
    workdir = base / name
    workdir.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(base / f"{name}.lock")):
        sources = _prepare_sources(name, workdir)
        build_dir = workdir / f"build-{_digest(sources)}"
        built = build_dir / f"{name}.so"
        if built.exists():
            return _load_so(name, built)
        _check_toolchain()
        build_dir.mkdir(exist_ok=True)
        print(f"ort_hf: building ORTModule extension {name} (once per torch/ORT version, 1-3 min)...", file=sys.stderr)
        try:
            cpp_extension.load(
                name=name,
                sources=[str(s) for s in sources],
                extra_cflags=_CFLAGS,
                extra_include_paths=[str(workdir / "src")],
                build_directory=str(build_dir),
                verbose=verbose,
            )
        except Exception as exc:  # compiler errors arrive as RuntimeError/subprocess errors
            import torch

            raise ExtensionBuildError(
                f"Building ORTModule's {name} extension failed against torch {torch.__version__}: {exc}\n"
                f"Build files: {build_dir}. Run `ort-hf doctor` for the toolchain check."
            ) from exc
        if not built.exists():
            raise ExtensionBuildError(f"Building {name} produced no shared library at {built}.")
        return _load_so(name, built)


def _load_so(name: str, so: Path):
    qualified = f"{ORT_EXTENSION_PACKAGE}.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise ExtensionBuildError(f"The built {name} at {so} does not load: {exc}. Delete {so.parent} to rebuild.") from exc
    sys.modules[qualified] = module
    package = sys.modules.get(ORT_EXTENSION_PACKAGE)
    if package is not None:
        setattr(package, name, module)
    _status[name] = ExtensionStatus(name, True, so)
    return module


def load_all() -> dict[str, ExtensionStatus]:
    """Build/load every extension ORTModule needs; failures are recorded, not raised."""
    for name in EXTENSIONS:
        if name in _status and _status[name].loaded:
            continue
        try:
            build_extension(name)
        except ExtensionBuildError as exc:
            _status[name] = ExtensionStatus(name, False, None, str(exc))
    return dict(_status)


def status() -> dict[str, ExtensionStatus]:
    return dict(_status)


def install_interop_stand_in() -> None:
    """Without a working torch_interop_utils, ORT still imports it when custom autograd is
    requested; a stand-in module lets ORT run with custom functions inlined at export."""
    import types

    qualified = f"{ORT_EXTENSION_PACKAGE}.torch_interop_utils"
    if qualified not in sys.modules:
        sys.modules[qualified] = types.ModuleType("torch_interop_utils")
