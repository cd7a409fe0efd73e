import pytest


@pytest.fixture(scope="session")
def aten_nodes_run():
    """ORT sessions here can run ATen nodes: ort_hf's kernels built and registered with torch,
    and ORT's executor that calls into torch for those nodes loaded."""
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # builds and loads our kernels
    from onnxruntime.training.ortmodule.torch_cpp_extensions.cpu.aten_op_executor import (
        load_aten_op_executor_cpp_extension,
    )

    load_aten_op_executor_cpp_extension()


@pytest.fixture
def one_torch_thread():
    """PyTorch on one intra-op thread for the test (the suite shares two cores with ORT's pool)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
