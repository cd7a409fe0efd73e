"""`ort-hf doctor`: one screen on whether ORT training works here, and what to fix if not."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import time


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def _train_one_step(device: str = "cpu") -> tuple[str, float]:
    """Run one training step of a tiny model through ORT with fallback disabled; returns what ran
    and the step's seconds (export, session and, on CUDA, kernel loading included)."""
    import torch

    from .engine import ORTOptions, wrap_model

    start = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to(device)
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR"))
    wrapped.train()
    loss = wrapped(torch.randn(4, 8, device=device)).square().mean()
    loss.backward()
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    status = wrapped.engine_status()
    if status.backend != "ort":
        raise RuntimeError(f"backend is {status.backend}: {status.fallback_reason}")
    provider = wrapped.session_providers()[0] if device != "cpu" else "CPUExecutionProvider"
    return f"ok (one step through ORT on {provider}, export {status.export_seconds:.2f}s)", seconds


# Until a GPU run (make test-gpu) says otherwise; README's status table says the same.
CUDA_STATUS = (
    "experimental: ort_hf's CUDA path has never run on a GPU (built and linked only); "
    "attach `make test-gpu`'s gpu-report.md to an issue with what you see"
)


def _gpu_lines(lines: list, problems: list) -> None:
    """The CUDA side: driver, GPUs against ORT's kernels, provider libraries, one step on CUDA."""
    import torch

    from .engine import apply_jit_environment, cuda_setup, describe_jit_environment, first_step_note, gpu_arch_note

    setup = cuda_setup()
    if not setup.provider_installed:
        lines.append(("CUDA provider", "none (onnxruntime-training-cpu)"))
        return
    if not setup.driver_present:
        lines.append(
            (
                "CUDA provider",
                "installed (gpu extra), but no NVIDIA driver here (libcuda.so.1): "
                "ORT trains on CPU, CUDA sessions are refused",
            )
        )
        lines.append(("CUDA support", CUDA_STATUS))
        return
    lines.append(("CUDA support", CUDA_STATUS))
    lines.append(
        (
            "NVIDIA driver",
            f"CUDA {setup.driver_cuda_version} (torch {torch.__version__} needs CUDA {torch.version.cuda})",
        )
    )
    jit = apply_jit_environment()  # already applied by run_doctor, before CUDA could be initialised
    lines.append(("CUDA JIT settings", describe_jit_environment(jit)))
    if jit.warning:
        problems.append(jit.warning)
    for soname, source in setup.library_sources.items():
        lines.append((f"  {soname}", source))
    if setup.provider_problem:
        problems.append(f"ORT's CUDA provider does not load: {setup.provider_problem}")
    if not torch.cuda.is_available():
        problems.append(
            f"torch sees no GPU although the driver is there: a CUDA {setup.driver_cuda_version} driver is older than "
            f"torch's CUDA {torch.version.cuda}, or no device is visible (CUDA_VISIBLE_DEVICES)."
        )
        return
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        lines.append((f"GPU {i}", f"{torch.cuda.get_device_name(i)}, {gpu_arch_note(cap)}"))
    message, seconds = _train_one_step("cuda")
    lines.append(("CUDA training check", message))
    lines.append(("  first step", first_step_note(torch.cuda.get_device_capability(0), seconds, os.environ)))


def run_doctor() -> int:
    lines: list[tuple[str, str]] = []
    problems: list[str] = []
    lines.append(("python", platform.python_version()))
    from ._versions import tested_ranges, untested

    for dist in ("torch", "transformers", "accelerate", "peft", "trl", "onnx"):
        tested = tested_ranges().get(dist)
        lines.append((dist, _version(dist) + (f" (tested: {tested})" if tested else "")))
    problems.extend(untested())
    ort_cpu, ort_gpu = _version("onnxruntime-training-cpu"), _version("onnxruntime-training")
    lines.append(("onnxruntime-training-cpu", ort_cpu))
    lines.append(("onnxruntime-training", ort_gpu))
    lines.append(("c++ compiler", shutil.which("c++") or shutil.which("g++") or "missing"))
    lines.append(("ninja", shutil.which("ninja") or "missing"))

    from .engine import apply_jit_environment, is_ort_training_available

    # First, while CUDA is not initialised: ensure_engine imports onnxruntime, and
    # torch.cuda.is_available() below runs cuInit.
    apply_jit_environment()
    can_train = False
    if not is_ort_training_available():
        from .engine import INSTALL_HINT

        problems.append(INSTALL_HINT)
    else:
        import torch

        from .engine import EngineUnavailableError, ExtensionBuildError, ensure_engine, extension_dir

        try:
            state = ensure_engine()  # the first import of onnxruntime (is_ort_training_available says why)
            import onnxruntime

            lines.append(("ORT providers", ", ".join(onnxruntime.get_available_providers())))
            lines.append(("device", "cuda" if torch.cuda.is_available() else "cpu (no CUDA device)"))
            lines.append(("extension cache", str(extension_dir())))
            for name, st in state.extensions.items():
                lines.append((f"  {name}", f"built: {st.path}" if st.loaded else f"FAILED: {st.error}"))
            if not state.pythonop_available:
                problems.append("PythonOp unavailable: custom autograd functions are inlined, label sparsity off.")
            lines.append(("training check", _train_one_step()[0]))
            can_train = True
            _gpu_lines(lines, problems)
        except (EngineUnavailableError, ExtensionBuildError, RuntimeError) as exc:
            problems.append(str(exc))

    width = max(len(k) for k, _ in lines)
    print("ort-hf doctor")
    for key, value in lines:
        print(f"  {key.ljust(width)}  {value}")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    print("  result: " + ("the engine can train" if can_train else "the engine cannot train here"))
    return 0 if can_train else 1
