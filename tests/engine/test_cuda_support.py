"""The CUDA support's CPU-side behaviour (the GPU side is `make gpu-check` and `make test-gpu`)."""

import os

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
        subprocess.run(
            [
                "cc",
                "-shared",
                "-fPIC",
                f"-Wl,-soname,{soname}",
                "-o",
                str(tmp_path / f"{name}.so"),
                str(tmp_path / f"{name}.c"),
            ],
            check=True,
        )
    for order in (("first", "second"), ("second", "first")):
        probe = (
            f"import ctypes, os; [ctypes.CDLL(os.path.join({str(tmp_path)!r}, n + '.so'), os.RTLD_GLOBAL) "
            f"for n in {order!r}]; from ort_hf.engine.cuda import _already_loaded; "
            f"print(_already_loaded({soname!r}))"
        )
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


@pytest.mark.parametrize(
    "matmul_precision, conv_precision, expected",
    [
        (None, None, "0"),  # torch 2.13's defaults: IEEE matmuls (TF32 convolutions)
        ("tf32", None, "1"),  # e.g. torch.set_float32_matmul_precision("high")
        ("tf32", "ieee", "0"),  # ORT has one switch for both: IEEE where torch is IEEE anywhere
        ("ieee", "tf32", "0"),
    ],
)
def test_orts_tf32_follows_torchs_fp32_precision(
    torch_precision, monkeypatch, matmul_precision, conv_precision, expected
):
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
        return (
            onnxruntime.SessionOptions(),
            ["CUDAExecutionProvider", "CPUExecutionProvider"],
            [{"device_id": "0"}, {}],
        )

    _, providers, options = model_hooks._session_config_per_model(ort_session_config)(None)
    assert options == [{"device_id": "0", "use_tf32": expected}, {}]


def test_orts_tf32_follows_the_legacy_switch_too():
    import subprocess
    import sys

    probe = (
        "import torch; from ort_hf.engine.cuda import torch_uses_tf32; a = torch_uses_tf32(); "
        "torch.set_float32_matmul_precision('high'); b = torch_uses_tf32(); "
        "torch.set_float32_matmul_precision('highest'); print(a, b, torch_uses_tf32())"
    )
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

    wrapped = wrap_model(
        build(FAMILIES["bert-cls"]),
        ORTOptions(fallback="disable", log_level="ERROR", save_onnx=True, onnx_dir=str(tmp_path / "ort")),
    )
    wrapped.train()
    wrapped(**make_batch("cls", torch.Generator().manual_seed(0))).loss.backward()
    assert wrapped.engine_status().backend == "ort"
    assert memcpy_nodes(tmp_path / "ort") == []
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    inner = helper.make_graph(
        [helper.make_node("MemcpyToHost", ["x"], ["y"], name="copy")],
        "body",
        [value],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    outer = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
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


def test_jit_variables_are_set_only_where_unset_and_before_cuda_starts():
    from ort_hf.engine.cuda_jit import JIT_DEFAULTS, decide_jit_environment, describe_jit_environment

    fresh = decide_jit_environment({}, cuda_initialised=False)
    assert fresh.set_by_ort_hf == JIT_DEFAULTS == {"CUDA_MODULE_LOADING": "LAZY", "CUDA_CACHE_MAXSIZE": "4294967296"}
    assert fresh.warning is None
    yours = decide_jit_environment({"CUDA_CACHE_MAXSIZE": "1073741824"}, cuda_initialised=False)
    assert yours.set_by_ort_hf == {"CUDA_MODULE_LOADING": "LAZY"}
    assert yours.given == {"CUDA_CACHE_MAXSIZE": "1073741824"}
    assert describe_jit_environment(yours) == (
        "CUDA_MODULE_LOADING=LAZY (set by ort_hf), CUDA_CACHE_MAXSIZE=1073741824 (already set: kept)"
    )
    late = decide_jit_environment({}, cuda_initialised=True)
    assert late.set_by_ort_hf == {}
    assert "export CUDA_MODULE_LOADING=LAZY CUDA_CACHE_MAXSIZE=4294967296" in late.warning
    assert decide_jit_environment({}, cuda_initialised=True, capabilities=((9, 0), (8, 0))).warning == late.warning
    native = decide_jit_environment({}, cuda_initialised=True, capabilities=((8, 0), (8, 9)))  # ORT's own cubins
    assert native.set_by_ort_hf == {} and native.warning is None


@pytest.mark.parametrize(
    "environ, mode, missing",
    [
        ({"CUDA_MODULE_LOADING": "LAZY"}, "LAZY", "export CUDA_CACHE_MAXSIZE=4294967296"),  # torch's LAZY, read in time
        # torch's LAZY set after something else ran cuInit (torch.cuda.is_available()): the driver is eager
        ({"CUDA_MODULE_LOADING": "LAZY"}, "EAGER", "export CUDA_CACHE_MAXSIZE=4294967296 CUDA_MODULE_LOADING=LAZY"),
        ({"CUDA_MODULE_LOADING": "EAGER", "CUDA_CACHE_MAXSIZE": "0"}, "EAGER", None),  # the user's choices
        (
            {"CUDA_MODULE_LOADING": "LAZY", "CUDA_CACHE_MAXSIZE": "0"},
            None,
            None,
        ),  # mode unknown: the environment's word
    ],
)
def test_after_cuda_started_the_warning_names_what_did_not_take_effect(environ, mode, missing):
    from ort_hf.engine.cuda_jit import decide_jit_environment

    decided = decide_jit_environment(environ, cuda_initialised=True, loading_mode=mode)
    assert decided.set_by_ort_hf == {} and decided.given == environ
    if missing is None:
        assert decided.warning is None
    else:
        assert decided.warning.endswith(missing) and "before starting Python" in decided.warning


def test_jit_variables_are_applied_once_with_one_warning(monkeypatch, caplog):
    from pathlib import Path

    from ort_hf.engine import cuda_jit

    for name in cuda_jit.JIT_DEFAULTS:
        monkeypatch.setenv(name, "x")  # recorded by monkeypatch, so the test's changes are undone
        monkeypatch.delenv(name)
    monkeypatch.setattr(cuda_jit, "_applied", None)
    monkeypatch.setattr(cuda_jit, "provider_library", lambda: Path("libonnxruntime_providers_cuda.so"))
    monkeypatch.setattr(cuda_jit, "driver_state", lambda: (False, None))
    assert cuda_jit.apply_jit_environment().set_by_ort_hf == cuda_jit.JIT_DEFAULTS
    assert {name: os.environ[name] for name in cuda_jit.JIT_DEFAULTS} == cuda_jit.JIT_DEFAULTS
    monkeypatch.setattr(cuda_jit, "_applied", None)
    monkeypatch.delenv("CUDA_CACHE_MAXSIZE")
    monkeypatch.setattr(cuda_jit, "driver_state", lambda: (True, "LAZY"))
    with caplog.at_level("WARNING", logger=cuda_jit.__name__):
        cuda_jit.apply_jit_environment()
        cuda_jit.apply_jit_environment()
    assert "CUDA_CACHE_MAXSIZE" not in os.environ
    assert [r.getMessage() for r in caplog.records].count(cuda_jit._applied.warning) == 1


def test_the_cpu_build_sets_no_cuda_variable(monkeypatch):
    from ort_hf.engine import cuda_jit

    if cuda.provider_library() is not None:
        pytest.skip("onnxruntime-training (CUDA build) is installed")
    monkeypatch.setattr(cuda_jit, "_applied", None)
    before = dict(os.environ)
    assert cuda_jit.apply_jit_environment() is None and dict(os.environ) == before


@pytest.mark.parametrize(
    "capability, environ, says",
    [
        ((8, 0), {}, "first step 94.2 s: native cubins (ORT's sm_80 build), nothing to JIT-compile"),
        ((8, 9), {}, "first step 94.2 s: native cubins (ORT's sm_86 build), nothing to JIT-compile"),
        (
            (9, 0),
            {"CUDA_MODULE_LOADING": "LAZY", "CUDA_CACHE_MAXSIZE": "4294967296"},
            "first step 94.2 s: this GPU's sm_90 has no ORT cubin, so the driver JIT-compiled ORT's compute_86 PTX for "
            "the kernels it ran (CUDA_MODULE_LOADING=LAZY), or read them from its JIT cache; the JIT cache "
            "(CUDA_CACHE_MAXSIZE=4294967296, ~/.nv/ComputeCache) keeps them for the next run",
        ),
        ((9, 0), {"CUDA_CACHE_PATH": "/scratch/jit"}, "every kernel of the provider (eager module loading)"),
        ((9, 0), {"CUDA_CACHE_PATH": "/scratch/jit"}, "(CUDA_CACHE_MAXSIZE=the driver's default, /scratch/jit)"),
        ((9, 0), {"CUDA_CACHE_DISABLE": "1"}, "the JIT cache is off (CUDA_CACHE_DISABLE=1), so every process compiles"),
        ((10, 0), {}, "first step 94.2 s: sm_100: not supported"),
    ],
)
def test_doctor_says_why_the_first_cuda_step_took_its_time(capability, environ, says):
    from ort_hf.engine import first_step_note

    assert says in first_step_note(capability, 94.2, environ)


def test_trainer_arguments_set_the_jit_variables_before_anything_initialises_cuda(monkeypatch, tmp_path):
    """TrainingArguments' device set-up runs torch.cuda.is_available(), hence cuInit, long before
    the model is wrapped: ORTTrainingArguments applies the variables first."""
    import torch

    from ort_hf.engine import cuda_jit
    from ort_hf.trainer import ORTTrainingArguments

    calls = []
    monkeypatch.setattr(cuda_jit, "apply_jit_environment", lambda: calls.append("jit"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: calls.append("cuda") or False)
    ORTTrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert calls[0] == "jit" and "cuda" in calls


def test_doctor_labels_cuda_experimental_wherever_the_gpu_build_is_installed(monkeypatch):
    from ort_hf import doctor, engine
    from ort_hf.engine.cuda import CudaSetup

    monkeypatch.setattr(engine, "cuda_setup", lambda: CudaSetup(provider_installed=True))  # no driver
    lines, problems = [], []
    doctor._gpu_lines(lines, problems)
    assert ("CUDA support", doctor.CUDA_STATUS) in lines and "never run on a GPU" in doctor.CUDA_STATUS
    monkeypatch.setattr(engine, "cuda_setup", lambda: CudaSetup(provider_installed=False))  # the CPU build
    lines = []
    doctor._gpu_lines(lines, problems)
    assert all(name != "CUDA support" for name, _ in lines)
