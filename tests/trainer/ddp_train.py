"""Train a tiny BERT with ORTTrainer, under ``torchrun --nproc_per_node N`` (DDP, gloo, CPU) or alone.

    torchrun --nproc_per_node 2 tests/trainer/ddp_train.py OUT.json --batch 4
    python tests/trainer/ddp_train.py OUT.json --batch 8

Both runs see the same global batches with the Trainer's default (random) sampler:
accelerate swaps RandomSampler for its SeedableRandomSampler seeded from ``seed`` (same
permutation on every rank and in the single process), and under DDP its BatchSamplerShard
hands rank r batch 2k+r of that permutation cut into per-device batches, so step k covers
permutation positions 8k..8k+7 either way. (``train_sampling_strategy="sequential"`` would
make the same point without relying on accelerate's sampler; the default is what users run.)
Rank 0 writes OUT.json (logged losses, each rank's engine backend, world size) and the final
parameters to OUT.safetensors. The logged loss is already the mean over ranks (the Trainer
all-gathers it), i.e. the mean over the global batch, comparable with the single-process run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import weakref
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from tiny_models import id_dataset
from transformers import BertConfig, BertForSequenceClassification

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

ROWS, SEQ, STEPS = 160, 16, 10


def synthetic_dataset():
    return id_dataset(ROWS, SEQ, lambda ids, g: torch.randint(0, 2, (ROWS,), generator=g), seed=1234)


def tiny_classifier() -> BertForSequenceClassification:
    """The 2-layer BERT both launch scripts train, initialised from seed 0, dropout off."""
    torch.manual_seed(0)
    return BertForSequenceClassification(
        BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            hidden_dropout_prob=0,
            attention_probs_dropout_prob=0,
            num_labels=2,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path, help="JSON result path (rank 0); parameters go to <out>.safetensors")
    parser.add_argument("--batch", type=int, required=True, help="per-device train batch size")
    parser.add_argument("--mem_efficient_grad", action="store_true", help="--ort_mem_efficient_grad_mgmt")
    parser.add_argument("--accumulation", type=int, default=1, help="gradient_accumulation_steps")
    cli = parser.parse_args()

    model = tiny_classifier()
    # accelerate treats any ddp_backend as "initialise torch.distributed": only under torchrun.
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as output_dir:
        args = ORTTrainingArguments(
            output_dir=output_dir,
            ort_fallback="disable",
            ort_log_level="ERROR",
            max_steps=STEPS,
            logging_steps=1,
            learning_rate=1e-3,
            seed=0,
            report_to=[],
            save_strategy="no",
            optim="adamw_torch",
            disable_tqdm=True,
            per_device_train_batch_size=cli.batch,
            use_cpu=True,
            ddp_backend="gloo" if launched else None,
            ort_mem_efficient_grad_mgmt=cli.mem_efficient_grad,
            gradient_accumulation_steps=cli.accumulation,
            # BertForSequenceClassification's loss is its batch mean: the Trainer (so ORTTrainer) would
            # multiply it by the number of processes when averaging tokens across them.
            average_tokens_across_devices=False,
        )
        trainer = ORTTrainer(model=model, args=args, train_dataset=synthetic_dataset())
        trainer.train()

    world = args.world_size
    distributed = world > 1
    assert distributed == (args.parallel_mode.value == "distributed"), args.parallel_mode
    if distributed:
        # DDP outside, the ORT engine module inside.
        assert isinstance(trainer._ort_run.train_model, torch.nn.parallel.DistributedDataParallel), type(
            trainer._ort_run.train_model
        )
        assert trainer._ort_run.train_model.module is trainer.ort_engine
    backend = trainer.ort_engine.engine_status().backend
    assert backend == "ort", f"rank {args.process_index}: backend {backend!r}"
    assert trainer.ort_engine.mem_efficient_grad_active() is cli.mem_efficient_grad  # read from ORT's graph

    backends = [backend]
    if distributed:
        backends = [None] * world
        dist.all_gather_object(backends, backend)

    if args.process_index == 0:
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert len(losses) == STEPS, trainer.state.log_history
        params = {n: p.detach().contiguous().clone() for n, p in trainer.model.named_parameters()}
        changed = sum(not torch.equal(init[n], p) for n, p in params.items())
        save_file(params, str(cli.out.with_suffix(".safetensors")))
        result = {"losses": losses, "backends": backends, "world_size": world, "changed_params": changed}
        cli.out.write_text(json.dumps(result))
    if distributed:
        ddp = weakref.ref(trainer._ort_run.train_model)
        del trainer, model
        close_process_group()
        assert ddp() is None, "the DDP wrapper outlived its trainer"


def close_process_group() -> None:
    """End a launched run once its caller has dropped its trainer: collect it first, so that DDP's
    reducer, with the gloo work and the tensors it holds, goes while the interpreter is whole (one
    rank of a full-suite run aborted after training, "terminate called without an active exception",
    with the process group destroyed but the trainer still alive into interpreter teardown), then
    destroy the process group once every rank is done."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
