"""The CUDA support's CPU-side behaviour (the GPU side is `make gpu-check` and `make test-gpu`)."""

import pytest

from ort_hf.engine import cuda


@pytest.mark.skipif(cuda.driver_present(), reason="this machine has an NVIDIA driver")
def test_a_cuda_session_without_driver_is_refused_not_aborted():
    with pytest.raises(RuntimeError, match="no NVIDIA driver.*train on CPU"):
        cuda.require_driver()


def test_gpu_architectures_are_explained():
    assert cuda.gpu_arch_note((8, 0)) == "sm_80: ORT's kernels run from their sm_80 build"
    assert cuda.gpu_arch_note((8, 9)) == "sm_89: ORT's kernels run from their sm_86 build (same major)"
    assert "JIT-compiles its compute_86 PTX" in cuda.gpu_arch_note((9, 0))
    assert "not supported" in cuda.gpu_arch_note((10, 0))


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


@pytest.fixture
def torch_precision():
    """torch's fp32 precision settings, restored after the test (new API only: mixing it with the
    legacy allow_tf32 view makes torch raise)."""
    import torch

    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = (matmul.fp32_precision, conv.fp32_precision)
    yield matmul, conv
    matmul.fp32_precision, conv.fp32_precision = saved


@pytest.mark.parametrize("matmul_precision, conv_precision, expected", [
    (None, None, "0"),         # torch 2.13's defaults: IEEE matmuls (TF32 convolutions)
    ("tf32", None, "1"),       # e.g. torch.set_float32_matmul_precision("high")
    ("tf32", "ieee", "0"),     # ORT has one switch for both: IEEE where torch is IEEE anywhere
    ("ieee", "tf32", "0"),
])
def test_orts_tf32_follows_torchs_fp32_precision(torch_precision, monkeypatch, matmul_precision, conv_precision,
                                                expected):
    """The provider options ort_hf hands ORT's CUDA session (use_tf32 defaults to on in ORT)."""
    import onnxruntime

    from ort_hf.engine import model_hooks

    matmul, conv = torch_precision
    if matmul_precision:
        matmul.fp32_precision = matmul_precision
    if conv_precision:
        conv.fp32_precision = conv_precision
    monkeypatch.setattr(cuda, "require_driver", lambda: None)  # no driver here; nothing is loaded

    def ort_session_config(self):  # what ORTModule's _get_session_config returns on CUDA
        return (onnxruntime.SessionOptions(), ["CUDAExecutionProvider", "CPUExecutionProvider"],
                [{"device_id": "0"}, {}])

    _, providers, options = model_hooks._session_config_per_model(ort_session_config)(None)
    assert options == [{"device_id": "0", "use_tf32": expected}, {}]


def test_orts_tf32_follows_the_legacy_switch_too():
    import subprocess
    import sys

    probe = ("import torch; from ort_hf.engine.cuda import torch_uses_tf32; a = torch_uses_tf32(); "
             "torch.set_float32_matmul_precision('high'); b = torch_uses_tf32(); "
             "torch.set_float32_matmul_precision('highest'); print(a, b, torch_uses_tf32())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "False"]


def test_memcpy_nodes_are_read_from_orts_saved_execution_model(tmp_path):
    """What the GPU tests count: on CPU ORT's execution model has none; a Memcpy node, in a
    subgraph too, is found and named."""
    import onnx
    import torch
    from onnx import TensorProto, helper
    from parity import memcpy_nodes
    from tiny_models import FAMILIES, build, make_batch

    from ort_hf.engine import ORTOptions, wrap_model

    wrapped = wrap_model(build(FAMILIES["bert-cls"]), ORTOptions(fallback="disable", log_level="ERROR",
                                                                 save_onnx=True, onnx_dir=str(tmp_path / "ort")))
    wrapped.train()
    wrapped(**make_batch("cls", torch.Generator().manual_seed(0))).loss.backward()
    assert wrapped.engine_status().backend == "ort"
    assert memcpy_nodes(tmp_path / "ort") == []
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    inner = helper.make_graph([helper.make_node("MemcpyToHost", ["x"], ["y"], name="copy")], "body", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    outer = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner)], "g",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    (tmp_path / "made").mkdir()
    onnx.save(helper.make_model(outer), str(tmp_path / "made" / "M_execution_model_training.onnx"))
    assert memcpy_nodes(tmp_path / "made") == ["M_execution_model_training.onnx: MemcpyToHost copy (x)"] * 2


def test_bf16_on_cuda_is_refused_by_the_engine_before_any_export(monkeypatch):
    """wrap_model users too (their own autocast): refused loudly, not a fallback, nothing exported."""
    import torch
    from tiny_models import FAMILIES, build, make_batch

    from ort_hf.engine import ORTOptions, wrap_model

    wrapped = wrap_model(build(FAMILIES["bert-cls"]), ORTOptions(fallback="auto", log_level="ERROR"))
    wrapped.train()
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device=None: device == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device: torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 with ORT on CUDA"):
        wrapped(**make_batch("cls", torch.Generator().manual_seed(0)))
    assert wrapped.engine_status().backend == "not_run"
