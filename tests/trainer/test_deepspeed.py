"""DeepSpeed ZeRO-1/2 around ORT: ``torchrun --nproc_per_node 2`` on CPU (gloo, DeepSpeed's CPU accelerator).

DeepSpeed's engine wraps the ORT engine module (deepspeed_train.py asserts it, and that ORT, not a
PyTorch fallback, ran on both ranks). Compared with: the same run without ORT (plain DeepSpeed, the
model's own loss on both sides, since plain transformers scales a sequence-classification loss that
ignores num_items_in_batch by the number of processes); and one process without DeepSpeed on the
doubled batch (ModuleWithLoss, whose loss honours num_items_in_batch: the global-batch mean).
fp16 (where ORT's FP16_Optimizer acts) needs CUDA: here only ORT's verdict on the ZeRO optimizer
is checked; the fp16 run is in tests/engine/test_gpu.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from launch import assert_close_params, load_result, run_all, torchrun
from transformers import BertForSequenceClassification

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (it comes with the dev extra)")

SCRIPT = Path(__file__).resolve().parent / "deepspeed_train.py"
STEPS = 10


def _loss_diffs(a: dict, b: dict, steps) -> list[float]:
    return [abs(a["losses"][str(s)] - b["losses"][str(s)]) for s in steps]


def test_zero2_through_ort_matches_one_process(tmp_path):
    zero2, single = tmp_path / "zero2.json", tmp_path / "single.json"
    run_all(
        {
            "zero2": torchrun(SCRIPT, zero2, "--stage", "2"),
            "single": [sys.executable, str(SCRIPT), str(single), "--stage", "0", "--batch", "8"],
        }
    )
    (ds, ds_params), (one, one_params) = load_result(zero2), load_result(single)
    assert ds["world_size"] == 2 and ds["backends"] == ["ort", "ort"] and one["backends"] == ["ort"]
    assert ds["zero_optimizer"] == "DeepSpeedZeroOptimizer"
    assert len(ds["losses"]) == STEPS
    assert max(_loss_diffs(ds, one, range(1, STEPS + 1))) <= 1e-4
    assert_close_params(ds_params, one_params, 1e-4)
    # ORT's FP16_Optimizer reached the ZeRO optimizer through accelerate's wrapper and said why it
    # left it unchanged on this machine (CPU, and DeepSpeed newer than the code ORT knows).
    assert ds["fp16_optimizer"].startswith("Skip modifying optimizer"), ds["fp16_optimizer"]


def test_zero1_with_config_optimizer_matches_plain_deepspeed(tmp_path):
    """DeepSpeed builds the optimizer and scheduler from its config (the Trainer's DummyOptim path)."""
    common = ("--stage", "1", "--config_optimizer", "--module_with_loss", "false")
    run_all(
        {
            "ort": torchrun(SCRIPT, tmp_path / "ort.json", *common),
            "pytorch": torchrun(SCRIPT, tmp_path / "pt.json", *common, "--use_ort", "false"),
        }
    )
    (ort, ort_params), (pt, pt_params) = load_result(tmp_path / "ort.json"), load_result(tmp_path / "pt.json")
    assert ort["backends"] == ["ort", "ort"] and pt["backends"] == ["pytorch", "pytorch"]
    assert len(ort["losses"]) == STEPS
    assert max(_loss_diffs(ort, pt, range(1, STEPS + 1))) <= 1e-5
    assert_close_params(ort_params, pt_params, 1e-5)


def test_zero2_checkpoint_is_plain_hf_and_resume_continues(tmp_path):
    full, resumed = tmp_path / "full.json", tmp_path / "resumed.json"
    out_dir = tmp_path / "run"
    run_all({"full": torchrun(SCRIPT, full, "--stage", "2", "--save_steps", "5", "--output_dir", out_dir)})
    checkpoint = out_dir / "checkpoint-5"
    # Plain transformers loads the checkpoint: every weight under its own name, none missing.
    model, info = BertForSequenceClassification.from_pretrained(checkpoint, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info

    run_all(
        {
            "resumed": torchrun(
                SCRIPT, resumed, "--stage", "2", "--output_dir", tmp_path / "run2", "--resume", checkpoint
            )
        }
    )
    (a, a_params), (b, b_params) = load_result(full), load_result(resumed)
    assert b["backends"] == ["ort", "ort"]
    assert (
        a["steps_run"] == STEPS and b["steps_run"] == STEPS - 5
    )  # continued from step 5, not retrained from the start
    assert max(_loss_diffs(a, b, range(6, STEPS + 1))) <= 1e-5
    assert_close_params(b_params, a_params, 1e-5)
