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
