"""Building ORT's torch extensions: the CUDA toolkit chosen, the ports, and failures that reach the
user as the build's own error. CPU-side: a CUDA build is forced against a fake toolkit."""

from pathlib import Path

import pytest
import torch

from ort_hf.engine import cuda_toolkit, extension_ports, extensions
from ort_hf.engine.errors import ExtensionBuildError


def _fake_toolkit(root: Path, version: int) -> Path:
    """A folder that looks like a CUDA toolkit of ``version`` (13000 = 13.0) to the chooser."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version // 1000}.{version % 1000 // 10}'\n")
    nvcc.chmod(0o755)
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "include" / "cuda.h").write_text(f"#define CUDA_VERSION {version}\n")
    return root


def test_the_toolkit_of_torchs_cuda_major_builds_and_the_others_are_named(tmp_path, monkeypatch):
    old = _fake_toolkit(tmp_path / "cuda-12.4", 12040)
    right = _fake_toolkit(tmp_path / "cuda-13.0", 13000)
    monkeypatch.setenv("CUDA_HOME", str(old))
    monkeypatch.setenv("PATH", f"{right / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    chosen = cuda_toolkit.find_toolkit(tmp_path / "cache", "13.0")
    assert chosen.home == right and chosen.version == "13.0" and chosen.source == "the nvcc on PATH"
    assert f"$CUDA_HOME ({old}) is CUDA 12.4" in chosen.describe()


def test_no_toolkit_of_torchs_cuda_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(_fake_toolkit(tmp_path / "cuda-12.4", 12040)))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(cuda_toolkit, "SYSTEM_TOOLKIT", str(tmp_path / "none"))
    monkeypatch.setattr(cuda_toolkit, "wheel_nvcc_root", lambda: None)
    with pytest.raises(ExtensionBuildError, match=r"CUDA major version \(13.0\).*is CUDA 12.4.*gpu-build"):
        cuda_toolkit.find_toolkit(tmp_path / "cache", "13.0")


@pytest.mark.parametrize("name", sorted(extension_ports.PORTS))
def test_each_port_replaces_exactly_what_it_names_in_orts_sources(name, tmp_path):
    extensions._prepare_sources(name, tmp_path)
    text = "".join(p.read_text() for p in (tmp_path / "src").iterdir() if p.is_file())
    for rep in extension_ports.PORTS[name]:
        assert rep.new in text and (rep.old not in text or rep.old in rep.new), rep.why
    if name == "torch_gpu_allocator":  # ORT calls the empty-cache address as void(): a wrapper of that type
        assert "&c10::cuda::CUDACachingAllocator::emptyCache)" not in text
        assert "void delegate_empty_cache() {\n  c10::cuda::CUDACachingAllocator::emptyCache();" in text


def test_a_port_that_no_longer_applies_stops_the_build(tmp_path):
    (tmp_path / "torch_gpu_allocator.cc").write_text("// sources of another ORT version\n")
    with pytest.raises(ExtensionBuildError, match="found 0 times.*extension_ports.py"):
        extension_ports.apply_port("torch_gpu_allocator", tmp_path)


def test_a_failing_cuda_build_reaches_the_user_as_the_builds_own_error(tmp_path, monkeypatch):
    """torch_gpu_allocator built 'for CUDA' against a toolkit without CUDA's headers: the error
    names the extension, the compilers and toolkit, the compiler's own message and what to install."""
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0", 13000)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    monkeypatch.setenv(extensions.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(ExtensionBuildError) as caught:
        extensions.build_extension("torch_gpu_allocator")
    said = str(caught.value)
    assert "Building ORTModule's torch_gpu_allocator extension with c++ and nvcc of CUDA 13.0 from $CUDA_HOME" in said
    # The compiler's words (the fake toolkit, and torch's CPU build, have no CUDA headers), first.
    assert said.index("fatal error:") < said.index("No such file") < said.index("--- end of the build log ---")
    assert "for sm 8.0" in said and "gpu-build" in said


def test_a_failed_extension_is_raised_with_its_build_error_when_required(monkeypatch):
    monkeypatch.setattr(extensions, "_status", {})
    monkeypatch.setattr(extensions, "needed_here", lambda: ("torch_gpu_allocator",))

    def failing_build(name, verbose=False):
        raise ExtensionBuildError(f"Building ORTModule's {name} extension with c++ failed: the compiler's words")

    monkeypatch.setattr(extensions, "build_extension", failing_build)
    statuses = extensions.load_all()  # recorded, not raised: doctor lists it
    assert not statuses["torch_gpu_allocator"].loaded
    with pytest.raises(ExtensionBuildError, match="torch_gpu_allocator extension with c\\+\\+ failed: the compiler"):
        extensions.require("torch_gpu_allocator")


def test_the_cuda_home_from_wheels_is_named_by_its_version(tmp_path, monkeypatch):
    wheel = _fake_toolkit(tmp_path / "nvidia" / "cu13", 13000)
    (wheel / "lib").mkdir()
    monkeypatch.setattr(cuda_toolkit, "wheel_nvcc_root", lambda: wheel)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(cuda_toolkit, "SYSTEM_TOOLKIT", str(tmp_path / "none"))
    chosen = cuda_toolkit.find_toolkit(tmp_path / "cache", "13.0")
    assert chosen.home == tmp_path / "cache" / "cuda-home-13.0" and (chosen.home / "bin" / "nvcc").exists()
    assert chosen.source == "NVIDIA's nvcc wheels (gpu-build extra)"
