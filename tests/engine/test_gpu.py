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
