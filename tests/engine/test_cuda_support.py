"""The CUDA support's CPU-side behaviour (the GPU side is `make gpu-check` and `make test-gpu`)."""

import pytest

from ort_hf.engine import cuda


@pytest.mark.skipif(cuda.driver_present(), reason="this machine has an NVIDIA driver")
def test_a_cuda_session_without_driver_is_refused_not_aborted():
    with pytest.raises(RuntimeError, match="no NVIDIA driver.*train on CPU"):
        cuda.require_driver()


def test_gpu_architectures_are_explained():
    assert "compiled for it" in cuda.arch_note((8, 0))
    assert "JIT-compiled from PTX" in cuda.arch_note((9, 0))
    assert "not supported" in cuda.arch_note((10, 0))


def test_cpu_build_loads_no_cuda_library():
    if cuda.provider_library() is not None:
        pytest.skip("onnxruntime-training (CUDA build) is installed")
    assert cuda.load_cuda_libraries() == {}


def test_library_source_is_the_one_the_loader_resolves_not_the_lowest_address(tmp_path):
    """Two files of one soname in a process (CUDA 11.8's and 13's libcurand.so.10 are such a
    pair): the one a lookup by soname resolves to is the first loaded, whatever its address."""
    import subprocess
    import sys

    soname = "libort_hf_probe.so.1"
    for name in ("first", "second"):
        (tmp_path / f"{name}.c").write_text(f"int which(void) {{ return {len(name)}; }}\n")
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(tmp_path / f"{name}.so"),
                        str(tmp_path / f"{name}.c")], check=True)
    for order in (("first", "second"), ("second", "first")):
        probe = (f"import ctypes, os; [ctypes.CDLL(os.path.join({str(tmp_path)!r}, n + '.so'), os.RTLD_GLOBAL) "
                 f"for n in {order!r}]; from ort_hf.engine.cuda import _already_loaded; "
                 f"print(_already_loaded({soname!r}))")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        assert out.strip() == str(tmp_path / f"{order[0]}.so")
