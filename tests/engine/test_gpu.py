"""CUDA paths: skipped with a reason on machines without a CUDA device (this project's CI).

Every ORT run here disables fallback, checks that ORT ran on CUDAExecutionProvider, and saves
ORT's execution graph to list the Memcpy nodes ORT inserted (a node of the data path placed on the
CPU). Each test records that list (``parity.record_memcpy_nodes``) for ``make test-gpu``'s report;
only the fp32 BERT parity test fails on it, so one misplaced node cannot fail every test alike.
"""

import dataclasses

import pytest
import torch
from parity import STRICT, assert_parity, record_memcpy_nodes, run_parity
from tiny_models import FAMILIES, SEQ, build, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]


def _cuda_batches(task: str, n: int = 5):
    gen = torch.Generator().manual_seed(0)
    return [{k: v.cuda() for k, v in make_batch(task, gen).items()} for _ in range(n)]


def _saving(tmp_path):
    return dataclasses.replace(STRICT, save_onnx=True, onnx_dir=str(tmp_path / "onnx"))


@pytest.fixture
def ran_on_cuda(record_property):
    """Checks that ORT ran on CUDA; records and returns the Memcpy nodes in its saved graphs."""

    def check(wrapped, onnx_dir) -> list[str]:
        status = wrapped.engine_status()
        assert status.backend == "ort", f"ORT did not run: {status}"
        assert wrapped.session_providers()[0] == "CUDAExecutionProvider", wrapped.session_providers()
        return record_memcpy_nodes(onnx_dir, record_property)

    return check


def test_cuda_training_matches_pytorch(tmp_path, ran_on_cuda):
    """fp32 through ORT equals PyTorch's fp32 (ORT's TF32 follows torch's setting: off by default),
    and every node of this BERT graph runs on CUDA: the one test that fails on a Memcpy node."""
    fam = FAMILIES["bert-mlm"]
    result = run_parity(build(fam, attn="sdpa").cuda(), _cuda_batches(fam.task), options=_saving(tmp_path))
    assert_parity(*result)
    moved = ran_on_cuda(result[-1], tmp_path / "onnx")
    assert not moved, "ORT placed nodes of the data path on the CPU:\n" + "\n".join(moved)
    assert result[-1].cuda_provider_options()["use_tf32"] == "0"


def test_label_sparsity_and_padding_elimination_fire_on_cuda(tmp_path, ran_on_cuda):
    """ModuleWithLoss computes the loss through an nn.CrossEntropyLoss module (the one ORT's label
    sparsity hooks); the batch is padded well below ORT's 90% density for padding elimination."""
    from ort_hf.engine import wrap_model
    from ort_hf.module_with_loss import ModuleWithLoss

    batch = make_batch("mlm", torch.Generator().manual_seed(0))
    for row, length in enumerate((SEQ, SEQ // 2, SEQ // 4, SEQ // 2)):
        batch["attention_mask"][row, length:] = 0
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 0)
    batch["labels"] = batch["labels"].masked_fill(batch["attention_mask"] == 0, -100)
    wrapped = wrap_model(ModuleWithLoss(build(FAMILIES["bert-mlm"]).cuda()), _saving(tmp_path))
    wrapped.train()
    wrapped(**{k: v.cuda() for k, v in batch.items()})["loss"].backward()
    ran_on_cuda(wrapped, tmp_path / "onnx")
    assert wrapped.label_sparsity_fired()
    ops = {node.op_type for node in wrapped.training_graph().graph.node}
    assert "ShrunkenGather" in ops  # label sparsity
    assert "PadAndUnflatten" in ops or "FlattenAndUnpad" in ops  # ORT's padding elimination (CUDA build only)


def _trainer(tmp_path, ran_on_cuda, **kw):
    from tiny_models import rule_dataset

    from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

    through_ort = kw.get("use_ort", True) is not False
    saving = {"ort_save_onnx": True, "ort_onnx_dir": str(tmp_path / "onnx")} if through_ort else {}
    args = ORTTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=8,
        logging_steps=1,
        learning_rate=1e-3,
        seed=0,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
        **saving,
        **kw,
    )
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=rule_dataset(32))
    trainer.train()
    if through_ort:
        ran_on_cuda(trainer.ort_engine, tmp_path / "onnx")
    return trainer


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_fp16_through_ort_matches_pytorch_fp16(tmp_path, ran_on_cuda):
    ort = _trainer(tmp_path / "ort", ran_on_cuda, fp16=True)
    pt = _trainer(tmp_path / "pt", ran_on_cuda, fp16=True, use_ort=False)
    assert max(abs(a - b) for a, b in zip(_losses(ort), _losses(pt))) <= 1e-2
    # The autocast graph was exported: float16 casts inside (TensorProto.FLOAT16 == 10).
    casts = [n for n in ort.ort_engine.training_graph().graph.node if n.op_type == "Cast"]
    assert any(a.name == "to" and a.i == 10 for n in casts for a in n.attribute)


def test_adamw_ort_fused_trains_like_torch_adamw(tmp_path, ran_on_cuda):
    fused = _trainer(tmp_path / "fused", ran_on_cuda, optim="adamw_ort_fused")
    torch_adamw = _trainer(tmp_path / "torch", ran_on_cuda, optim="adamw_torch")
    assert type(fused.optimizer.optimizer).__name__ == "FusedAdam"
    assert max(abs(a - b) for a, b in zip(_losses(fused), _losses(torch_adamw))) <= 1e-4


def test_memory_stats_and_memory_efficient_gradients_on_cuda(tmp_path, ran_on_cuda):
    trainer = _trainer(tmp_path, ran_on_cuda, ort_mem_efficient_grad_mgmt=True)
    assert trainer.ort_engine.mem_efficient_grad_active() is True
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    assert logged["memory/peak_mb"] > 0 and "memory/allocated_mb" in logged


def test_adamw_ort_fused_is_ort_fused_adam_on_cuda(tmp_path):
    from ort_hf.trainer import ADAMW_ORT_FUSED, ORTTrainer, ORTTrainingArguments

    args = ORTTrainingArguments(output_dir=str(tmp_path), optim=ADAMW_ORT_FUSED, report_to=[])
    cls, kwargs = ORTTrainer.get_optimizer_cls_and_kwargs(args)
    assert cls.__name__ == "FusedAdam" and int(kwargs["adam_w_mode"]) == 2  # ADAMW_TORCH


def test_deepspeed_zero2_fp16_through_ort_matches_plain_deepspeed(tmp_path, record_property):
    """ZeRO-2 with fp16 on one GPU (nccl): ORT inside DeepSpeed trains like plain DeepSpeed, and the
    run logs once whether ORT's FP16_Optimizer swapped in its fused kernels (it does so only for the
    DeepSpeed code it knows)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    from pathlib import Path

    from launch import load_result, run_all, torchrun

    script = Path(__file__).resolve().parents[1] / "trainer" / "deepspeed_train.py"
    common = ("--stage", "2", "--fp16", "--module_with_loss", "false")
    run_all(
        {
            "ort": torchrun(script, tmp_path / "ort.json", *common, "--onnx_dir", tmp_path / "onnx", nproc=1),
            "pytorch": torchrun(script, tmp_path / "pt.json", *common, "--use_ort", "false", nproc=1),
        }
    )
    (ort, _), (pt, _) = load_result(tmp_path / "ort.json"), load_result(tmp_path / "pt.json")
    assert ort["backends"] == ["ort"] and ort["providers"][0] == "CUDAExecutionProvider"
    record_memcpy_nodes(tmp_path / "onnx", record_property)
    assert max(abs(ort["losses"][s] - pt["losses"][s]) for s in pt["losses"]) <= 1e-2
    assert ort["logged_fp16_optimizer"] in ([0.0], [1.0])
    assert ort["fp16_optimizer"] == "applied" or ort["fp16_optimizer"].startswith("Skip modifying optimizer")
