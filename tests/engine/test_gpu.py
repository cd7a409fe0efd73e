"""CUDA paths: skipped with a reason on machines without a CUDA device (this project's CI)."""

import pytest
import torch
from parity import STRICT, assert_parity, run_parity
from tiny_models import FAMILIES, build, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


def test_cuda_training_matches_pytorch():
    fam = FAMILIES["bert-mlm"]
    gen = torch.Generator().manual_seed(0)
    batches = [{k: v.cuda() for k, v in make_batch(fam.task, gen).items()} for _ in range(5)]
    assert_parity(*run_parity(build(fam, attn="sdpa").cuda(), batches, options=STRICT))


def test_adamw_ort_fused_is_ort_fused_adam_on_cuda():
    from ort_hf.trainer import ADAMW_ORT_FUSED, ORTTrainer, ORTTrainingArguments

    args = ORTTrainingArguments(output_dir="/tmp/ort_hf_gpu", optim=ADAMW_ORT_FUSED, report_to=[])
    cls, kwargs = ORTTrainer.get_optimizer_cls_and_kwargs(args)
    assert cls.__name__ == "FusedAdam" and int(kwargs["adam_w_mode"]) == 2  # ADAMW_TORCH


def test_deepspeed_zero2_fp16_through_ort_matches_plain_deepspeed(tmp_path):
    """ZeRO-2 with fp16 on one GPU: ORT inside DeepSpeed trains like plain DeepSpeed, and the run
    logs once whether ORT's FP16_Optimizer swapped in its fused kernels (it does so only for the
    DeepSpeed code it knows)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    from pathlib import Path

    from launch import load_result, run_all, torchrun

    script = Path(__file__).resolve().parents[1] / "trainer" / "deepspeed_train.py"
    common = ("--stage", "2", "--fp16", "--module_with_loss", "false")
    run_all({
        "ort": torchrun(script, tmp_path / "ort.json", *common, nproc=1),
        "pytorch": torchrun(script, tmp_path / "pt.json", *common, "--use_ort", "false", nproc=1),
    })
    (ort, _), (pt, _) = load_result(tmp_path / "ort.json"), load_result(tmp_path / "pt.json")
    assert ort["backends"] == ["ort"]
    assert max(abs(ort["losses"][s] - pt["losses"][s]) for s in pt["losses"]) <= 1e-2
    assert ort["logged_fp16_optimizer"] in ([0.0], [1.0])
    assert ort["fp16_optimizer"] == "applied" or ort["fp16_optimizer"].startswith("Skip modifying optimizer")
