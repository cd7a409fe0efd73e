"""Train a tiny BERT with ORTTrainer under DeepSpeed ZeRO-1/2, launched by ``torchrun --nproc_per_node 2``
(gloo on CPU with DeepSpeed's CPU accelerator; nccl on CUDA with --fp16).

    torchrun --nproc_per_node 2 tests/trainer/deepspeed_train.py OUT.json --stage 2 [--use_ort false]
        [--module_with_loss false] [--config_optimizer] [--save_steps 5] [--resume CHECKPOINT] [--steps 10]
    python tests/trainer/deepspeed_train.py OUT.json --stage 0 --batch 8    # no DeepSpeed, one process

``--config_optimizer`` puts an AdamW optimizer and a WarmupDecayLR scheduler in the DeepSpeed config
(DeepSpeed builds them) instead of the Trainer's. Rank 0 writes OUT.json (logged losses by step, optimizer steps taken in this process,
each rank's engine backend, what wraps what, ORT's FP16_Optimizer verdict on the ZeRO optimizer)
and the final parameters to OUT.safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch.distributed as dist
from ddp_train import close_process_group, synthetic_dataset, tiny_classifier  # the script's own folder is on sys.path
from safetensors.torch import save_file
from transformers import TrainerCallback  # noqa: E402

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments  # noqa: E402


def _backend(on_cuda: bool) -> str:
    # ZeRO-2 reduces and gathers CUDA tensors: gloo has no such collectives on GPU (nccl does).
    return "nccl" if on_cuda else "gloo"


def deepspeed_config(stage: int, config_optimizer: bool, fp16: bool = False) -> dict:
    config = {
        "fp16": {"enabled": fp16},
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    if config_optimizer:
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
        config["scheduler"] = {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        }
    return config


class StepCounter(TrainerCallback):
    """Optimizer steps this process took (a resumed run takes only the remaining ones)."""

    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--use_ort", default="true")
    parser.add_argument("--module_with_loss", default="true")
    parser.add_argument("--batch", type=int, default=4, help="per-device train batch size")
    parser.add_argument("--config_optimizer", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--save_steps", type=int, default=0)
    parser.add_argument("--output_dir", type=Path)
    parser.add_argument("--resume")
    parser.add_argument("--fp16", action="store_true", help="CUDA: DeepSpeed's fp16, ORT's FP16_Optimizer")
    parser.add_argument("--onnx_dir", type=Path, help="save ORT's graphs there (the GPU test reads placements)")
    cli = parser.parse_args()
    use_ort = cli.use_ort == "true"
    deepspeed = cli.stage > 0

    model = tiny_classifier()
    args = ORTTrainingArguments(
        output_dir=str(cli.output_dir or cli.out.parent / f"{cli.out.stem}_run"),
        ort_fallback="disable",
        ort_log_level="ERROR",
        max_steps=cli.steps,
        logging_steps=1,
        learning_rate=1e-3,
        warmup_steps=2,
        seed=0,
        report_to=[],
        save_strategy="steps" if cli.save_steps else "no",
        save_steps=cli.save_steps or 500,
        optim="adamw_torch",
        disable_tqdm=True,
        per_device_train_batch_size=cli.batch,
        use_cpu=not cli.fp16,
        use_ort=use_ort,
        use_module_with_loss=cli.module_with_loss == "true",
        ddp_backend=_backend(cli.fp16) if deepspeed else None,
        deepspeed=deepspeed_config(cli.stage, cli.config_optimizer, cli.fp16) if deepspeed else None,
        fp16=cli.fp16,
        ort_save_onnx=cli.onnx_dir is not None,
        ort_onnx_dir=str(cli.onnx_dir) if cli.onnx_dir else None,
        # BertForSequenceClassification's loss is its batch mean: the Trainer (so ORTTrainer) would
        # multiply it by the number of processes when averaging tokens across them.
        average_tokens_across_devices=False,
    )
    counter = StepCounter()
    trainer = ORTTrainer(model=model, args=args, train_dataset=synthetic_dataset(), callbacks=[counter])
    trainer.train(resume_from_checkpoint=cli.resume)

    backend = trainer.ort_engine.engine_status().backend if use_ort else "pytorch"
    providers = trainer.ort_engine.session_providers() if use_ort else []
    backends, fp16_verdict = [backend], None
    if deepspeed:
        from deepspeed import DeepSpeedEngine

        wrapped = trainer.model_wrapped
        assert isinstance(wrapped, DeepSpeedEngine), type(wrapped)
        # DeepSpeed outside, the ORT engine module inside (or the plain model without ORT).
        assert wrapped.module is (trainer.ort_engine if use_ort else trainer.model), type(wrapped.module)
        backends = [None] * args.world_size
        dist.all_gather_object(backends, backend)
        if use_ort:
            from ort_hf.engine.optim import apply_fp16_optimizer

            # What ORT's FP16_Optimizer makes of this ZeRO optimizer (fp16 itself needs CUDA).
            fp16_verdict = apply_fp16_optimizer(trainer.optimizer) or "applied"

    if args.process_index == 0:
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        params = {n: p.detach().contiguous().clone() for n, p in trainer.model.named_parameters()}
        save_file(params, str(cli.out.with_suffix(".safetensors")))
        result = {
            "losses": losses,
            "backends": backends,
            "providers": providers,
            "world_size": args.world_size,
            "steps_run": counter.steps,
            "zero_optimizer": type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,
            "fp16_optimizer": fp16_verdict,
            "logged_fp16_optimizer": [
                h["ort/fp16_optimizer"] for h in trainer.state.log_history if "ort/fp16_optimizer" in h
            ],
        }
        cli.out.write_text(json.dumps(result))
    if deepspeed:
        del trainer, model, wrapped
        close_process_group()


if __name__ == "__main__":
    main()
