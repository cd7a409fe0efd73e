"""`make gpu-check`: prove the CUDA path on a machine without a GPU.

Run in the venv `make gpu-check` builds (CUDA torch 2.13 + the gpu and gpu-build extras). It
builds ORT's four torch extensions with nvcc into ort_hf's extension cache and imports them,
loads ORT's CUDA provider library (every dependency must resolve), then creates a CUDA session
against a stub driver that reports no device (scripts/stub_libcuda.c), in a child process: the
provider must load and fail with CUDA's "no CUDA-capable device" error, not a missing library.
It reads the compute capabilities ORT's CUDA provider carries (cubins and PTX, with cuobjdump from
the gpu-build extra) and fails when they differ from what ort_hf records (``cuda.ORT_SASS_ARCHS``,
``ORT_PTX_ARCHS``: what README and doctor say). Finally `ort-hf doctor` must exit cleanly on this
GPU-less machine. Exits non-zero on any failure; the last line says what was proved.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NO_DEVICE = "CUDA failure 100: no CUDA-capable device is detected"

SESSION_PROBE = r"""
import onnx, onnxruntime
from onnx import TensorProto, helper
from ort_hf.engine import cuda
problem = cuda.check_provider_links()
for soname, source in cuda.library_sources().items():
    print(f"gpu-check:   {soname:<26} {source}", flush=True)
if problem:
    raise SystemExit(f"PROVIDER DOES NOT LOAD: {problem}")
print("gpu-check: provider library loaded", flush=True)
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ORT 1.19 reads IR <= 10
session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
print("providers in use:", session.get_providers())
"""


def step(title: str):
    print(f"gpu-check: {title}", flush=True)


def fail(message: str) -> int:
    print(f"gpu-check: FAIL: {message}", flush=True)
    return 1


def provider_archs(provider: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(cubin archs, PTX archs) in the provider library, read with cuobjdump."""
    from ort_hf.engine import cuda_toolkit

    wheel_bin = cuda_toolkit.wheel_nvcc_root()
    tool = shutil.which("cuobjdump", path=str(wheel_bin / "bin") if wheel_bin else None) or shutil.which("cuobjdump")
    if tool is None:
        raise FileNotFoundError("cuobjdump not found: pip install the gpu-build extra (nvidia-cuda-cuobjdump)")
    found = []
    for flag in ("--list-elf", "--list-ptx"):
        listing = subprocess.run([tool, flag, str(provider)], capture_output=True, text=True, check=True).stdout
        archs = {(int(m[0]), int(m[1:])) for m in re.findall(r"\.sm_(\d\d+)\.(?:cubin|ptx)", listing)}
        found.append(sorted(archs))
    return found[0], found[1]


def main() -> int:
    import torch

    if torch.version.cuda is None:
        return fail(f"torch {torch.__version__} is a CPU build; `make gpu-check` installs the CUDA build")
    step(f"torch {torch.__version__} (CUDA {torch.version.cuda}), GPU visible: {torch.cuda.is_available()}")

    from ort_hf.engine import cuda, cuda_toolkit, extensions

    archs = cuda_toolkit.gpu_archs()
    # The wheels are what a GPU machine without a CUDA toolkit builds with: prove that path.
    os.environ["CUDA_HOME"] = str(cuda_toolkit.wheel_cuda_home(extensions.extension_dir()))
    step(f"nvcc from NVIDIA's wheels: {os.environ['CUDA_HOME']}")
    built = []
    for name in extensions.EXTENSIONS:
        start = time.perf_counter()
        try:
            module = extensions.build_extension(name)
        except Exception as exc:  # noqa: BLE001 - reported, then the check fails
            return fail(f"{name}: {exc}")
        built.append(name)
        step(f"{name}: built and imported ({module.__file__}, {time.perf_counter() - start:.0f} s)")

    provider = cuda.provider_library()
    sass, ptx = provider_archs(provider)
    named = lambda archs: ", ".join(f"sm_{a}{b}" for a, b in archs)  # noqa: E731
    step(f"{provider.name} carries cubins for {named(sass)}; PTX for {named(ptx)}")
    if sass != sorted(cuda.ORT_SASS_ARCHS) or ptx != sorted(cuda.ORT_PTX_ARCHS):
        return fail(
            f"ort_hf records cubins {named(cuda.ORT_SASS_ARCHS)} and PTX {named(cuda.ORT_PTX_ARCHS)} "
            "(ort_hf/engine/cuda.py, README, doctor): update them to what the binary carries"
        )

    # Loading the provider library needs a driver (ORT aborts without one): both the link check
    # and the session run in a child process against the stub driver.
    with tempfile.TemporaryDirectory() as stub_dir:
        stub = Path(stub_dir) / cuda.DRIVER
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(stub), str(HERE / "stub_libcuda.c")], check=True)
        env = dict(os.environ, LD_LIBRARY_PATH=f"{stub_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        probe = subprocess.run([sys.executable, "-c", SESSION_PROBE], env=env, capture_output=True, text=True)
    output = probe.stdout + probe.stderr
    print("\n".join(line for line in probe.stdout.splitlines() if line.startswith("gpu-check:")), flush=True)
    if "provider library loaded" not in probe.stdout:
        return fail(f"ORT's CUDA provider does not load:\n{output[-3000:]}")
    step(f"{cuda.provider_library().name}: every dependency resolves")
    if probe.returncode != 0 and NO_DEVICE not in output:
        return fail(f"CUDA session against the stub driver ended with code {probe.returncode}:\n{output[-3000:]}")
    if NO_DEVICE not in output:
        return fail(f"the provider did not reach the driver (no '{NO_DEVICE}' error):\n{output[-3000:]}")
    said = next(line for line in output.splitlines() if NO_DEVICE in line)
    step(f"CUDA session against the stub driver (exit {probe.returncode}): {said.strip()[:300]}")

    doctor = subprocess.run([sys.executable, "-m", "ort_hf.cli", "doctor"], capture_output=True, text=True)
    print(doctor.stdout[-2500:], flush=True)
    if doctor.returncode != 0:
        return fail(f"`ort-hf doctor` exited {doctor.returncode} on this GPU-less machine:\n{doctor.stderr[-2000:]}")

    print(
        f"gpu-check: PASS: built and imported {', '.join(built)} for sm {archs}; ORT's CUDA provider carries "
        f"cubins and PTX for {named(sass)}, as recorded; every library of ORT's CUDA "
        f"provider resolves; with a stub driver the provider loads and reports '{NO_DEVICE}'; ort-hf doctor exits "
        "cleanly without a GPU",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
