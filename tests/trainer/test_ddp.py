"""DDP through ORT: ``torchrun --nproc_per_node 2`` x batch 4 trains like one process x batch 8.

ORTTrainer wraps DDP outside the ORT engine module; ddp_train.py asserts that, and that ORT
(not a PyTorch fallback) ran on every rank. Each step sees the same 8 samples in both runs
(4 + 4 across ranks, from the default seeded sampler; see ddp_train.py). Under DDP each rank's
loss is its local mean (average_tokens_across_devices: sum / global count * world size), DDP
averages the gradients, and the logged loss is the Trainer's all-gathered mean over ranks:
the global-batch mean, directly comparable with the single process.
"""

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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "ddp_train.py"
BIN = Path(sys.executable).parent
TIMEOUT = 300
STEPS = 10


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # the single-process run must not think it is distributed
    return env


def _run_all(commands: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """Start every command at once (the two runs overlap on 2 cores), then wait for each,
    all within TIMEOUT; a run still going then is killed with its whole process group."""
    procs = {
        name: subprocess.Popen(
            cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # torchrun's ranks share its process group: kill them together
        )
        for name, cmd in commands.items()
    }
    deadline = time.monotonic() + TIMEOUT
    results = {}
    try:
        for name, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} run did not finish within {TIMEOUT}s: {' '.join(proc.args)}")
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return results


def _load(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads(out.read_text()), load_file(str(out.with_suffix(".safetensors")))


def test_ddp_two_ranks_match_single_process(tmp_path):
    torchrun = BIN / "torchrun"
    if not torchrun.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    ddp_out, single_out = tmp_path / "ddp.json", tmp_path / "single.json"
    port = _free_port()
    results = _run_all(
        {
            "ddp": [
                str(torchrun), "--nnodes", "1", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(port),
                str(SCRIPT), str(ddp_out), "--batch", "4",
            ],
            "single": [sys.executable, str(SCRIPT), str(single_out), "--batch", "8"],
        }
    )
    for name, res in results.items():
        assert res.returncode == 0, f"{name} run failed ({res.returncode}):\n{res.stdout[-6000:]}"

    ddp, ddp_params = _load(ddp_out)
    single, single_params = _load(single_out)
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert ddp["backends"] == ["ort", "ort"] and single["backends"] == ["ort"]

    assert len(ddp["losses"]) == len(single["losses"]) == STEPS
    diffs = [abs(a - b) for a, b in zip(ddp["losses"], single["losses"])]
    assert max(diffs) <= 1e-4, f"per-step loss diffs {diffs}"

    assert ddp_params.keys() == single_params.keys()
    for name, ref in single_params.items():
        torch.testing.assert_close(ddp_params[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    # The comparison is about trained weights: the script counts tensors that left their init.
    assert ddp["changed_params"] == single["changed_params"] == len(single_params)


def _torchrun(out: Path, *extra: str) -> list[str]:
    return [str(BIN / "torchrun"), "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(_free_port()), str(SCRIPT), str(out), *extra]


def test_ddp_with_memory_efficient_gradients_matches_plain_ddp(tmp_path):
    """ORT hands each gradient to DDP from inside its backward (param.backward(grad)); with
    gradient accumulation the losses and weights equal plain DDP's."""
    if not (BIN / "torchrun").exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    common = ("--batch", "2", "--accumulation", "2")
    results = _run_all({
        "plain": _torchrun(tmp_path / "plain.json", *common),
        "mem_efficient": _torchrun(tmp_path / "mem.json", *common, "--mem_efficient_grad"),
    })
    for name, res in results.items():
        assert res.returncode == 0, f"{name} run failed ({res.returncode}):\n{res.stdout[-6000:]}"
    (plain, plain_params), (mem, mem_params) = _load(tmp_path / "plain.json"), _load(tmp_path / "mem.json")
    assert mem["world_size"] == 2 and mem["backends"] == ["ort", "ort"]
    assert len(mem["losses"]) == STEPS
    assert max(abs(a - b) for a, b in zip(plain["losses"], mem["losses"])) <= 1e-5
    assert mem["changed_params"] == len(mem_params)
    for name, ref in plain_params.items():
        torch.testing.assert_close(mem_params[name], ref, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
