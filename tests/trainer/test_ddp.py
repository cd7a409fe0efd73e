"""DDP through ORT: ``torchrun --nproc_per_node 2`` x batch 4 trains like one process x batch 8.

ORTTrainer wraps DDP outside the ORT engine module; ddp_train.py asserts that, and that ORT
(not a PyTorch fallback) ran on every rank. Each step sees the same 8 samples in both runs
(4 + 4 across ranks, from the default seeded sampler; see ddp_train.py). Under DDP each rank's
loss is its local mean (average_tokens_across_devices: sum / global count * world size), DDP
averages the gradients, and the logged loss is the Trainer's all-gathered mean over ranks:
the global-batch mean, directly comparable with the single process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launch import assert_close_params, load_result, run_all, torchrun

SCRIPT = Path(__file__).resolve().parent / "ddp_train.py"
STEPS = 10


def test_ddp_two_ranks_match_single_process(tmp_path):
    ddp_out, single_out = tmp_path / "ddp.json", tmp_path / "single.json"
    run_all(
        {
            "ddp": torchrun(SCRIPT, ddp_out, "--batch", "4"),
            "single": [sys.executable, str(SCRIPT), str(single_out), "--batch", "8"],
        }
    )
    ddp, ddp_params = load_result(ddp_out)
    single, single_params = load_result(single_out)
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert ddp["backends"] == ["ort", "ort"] and single["backends"] == ["ort"]

    assert len(ddp["losses"]) == len(single["losses"]) == STEPS
    diffs = [abs(a - b) for a, b in zip(ddp["losses"], single["losses"])]
    assert max(diffs) <= 1e-4, f"per-step loss diffs {diffs}"

    assert_close_params(ddp_params, single_params, 1e-4)
    # The comparison is about trained weights: the script counts tensors that left their init.
    assert ddp["changed_params"] == single["changed_params"] == len(single_params)


def test_ddp_with_memory_efficient_gradients_matches_plain_ddp(tmp_path):
    """ORT hands each gradient to DDP from inside its backward (param.backward(grad)); with
    gradient accumulation the losses and weights equal plain DDP's."""
    common = ("--batch", "2", "--accumulation", "2")
    run_all(
        {
            "plain": torchrun(SCRIPT, tmp_path / "plain.json", *common),
            "mem_efficient": torchrun(SCRIPT, tmp_path / "mem.json", *common, "--mem_efficient_grad"),
        }
    )
    (plain, plain_params), (mem, mem_params) = load_result(tmp_path / "plain.json"), load_result(tmp_path / "mem.json")
    assert mem["world_size"] == 2 and mem["backends"] == ["ort", "ort"]
    assert len(mem["losses"]) == STEPS
    assert max(abs(a - b) for a, b in zip(plain["losses"], mem["losses"])) <= 1e-5
    assert mem["changed_params"] == len(mem_params)
    assert_close_params(mem_params, plain_params, 1e-5)
