"""Running training scripts as separate processes (torchrun ranks or a single process) from tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TIMEOUT = 300


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(script: Path, *args: str, nproc: int = 2) -> list[str]:
    if not (BIN / "torchrun").exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    return [
        str(BIN / "torchrun"),
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        *map(str, args),
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONFAULTHANDLER"] = "1"  # a run that aborts prints each thread's Python stack
    # This checkout's ort_hf and the tests' helpers (tiny_models, ...), as pytest's pythonpath has them.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), *filter(None, [env.get("PYTHONPATH")])])
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a single-process run must not think it is distributed
    return env


def run_all(commands: dict[str, list[str]], timeout: float = TIMEOUT) -> dict[str, subprocess.CompletedProcess]:
    """Start every command at once (they overlap on 2 cores), then wait for each, all within
    ``timeout``; a run still going then is killed with its whole process group. Each must exit 0."""
    procs = {
        name: subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # torchrun's ranks share its process group: kill them together
        )
        for name, cmd in commands.items()
    }
    deadline = time.monotonic() + timeout
    results = {}
    try:
        for name, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} run did not finish within {timeout}s: {' '.join(proc.args)}")
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for name, res in results.items():
        assert res.returncode == 0, f"{name} run failed ({res.returncode}):\n{res.stdout[-6000:]}"
    return results


def load_result(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The JSON a training script wrote to ``out`` and the parameters it saved next to it."""
    return json.loads(out.read_text()), load_file(str(out.with_suffix(".safetensors")))


def assert_close_params(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], tol: float) -> None:
    """Same parameter names, each tensor allclose (rtol ``tol``, atol ``tol / 10``)."""
    assert got.keys() == ref.keys()
    for name, value in ref.items():
        torch.testing.assert_close(got[name], value, rtol=tol, atol=tol / 10, msg=lambda m: f"{name}: {m}")
