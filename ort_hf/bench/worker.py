"""One benchmark run in a fresh process: ``python -m ort_hf.bench.worker --workload W --variant V
--result out.json [settings]``. Trains the warm-up and measured steps through ORTTrainer and
writes what it measured (or why it failed) as JSON. The runner starts one at a time."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import fields
from pathlib import Path

from .spec import VARIANTS, WORKLOADS, BenchSettings, Variant, Workload


def settings_argv(settings: BenchSettings) -> list[str]:
    """The worker flags that reproduce ``settings`` (``none`` stands for None)."""
    argv = []
    for f in fields(BenchSettings):
        value = getattr(settings, f.name)
        argv += [f"--{f.name}", "none" if value is None else str(value)]
    return argv


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ort_hf.bench.worker", description=__doc__)
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--result", required=True, help="where to write the JSON result")
    parser.add_argument("--round", type=int, default=0)
    types = {"int": int, "float": float, "str": str}
    for f in fields(BenchSettings):
        kind = str(f.type).split(" |")[0]
        parser.add_argument(f"--{f.name}", type=_optional(types.get(kind, str)), default=argparse.SUPPRESS)
    return parser


def _settings(ns: argparse.Namespace) -> BenchSettings:
    given = {f.name: getattr(ns, f.name) for f in fields(BenchSettings) if hasattr(ns, f.name)}
    return BenchSettings(**given)


def _reason(exc: BaseException) -> str:
    """The exception's message on one line (ORTTrainer's resume hint left out: the bench saves nothing)."""
    lines = [
        line.strip()
        for line in str(exc).strip().splitlines()
        if line.strip() and not line.startswith("Last complete checkpoint:")
    ]
    return f"{type(exc).__name__}: {' / '.join(lines)[:400]}".strip()


def run(workload: Workload, variant: Variant, settings: BenchSettings) -> dict:
    import torch

    torch.set_num_threads(settings.threads)
    from .data import DataMissing, build_dataset, collator_for, num_labels
    from .models import build_model, load_tokenizer

    tokenizer = load_tokenizer(settings)
    try:
        dataset = build_dataset(workload, settings, tokenizer)
    except DataMissing as exc:
        return {"status": "skipped", "reason": str(exc)}
    model = build_model(
        workload, settings, tokenizer, masked_head=variant.name == "masked-head", num_labels=num_labels(dataset) or 2
    )
    collate = collator_for(workload, tokenizer)
    if variant.trim:
        collate = _trimmed(collate)
    return _train(workload, variant, settings, model, dataset, collate)


def _trimmed(collate):
    from ..engine import trim_trailing_padding

    return lambda rows: trim_trailing_padding(collate(rows))[0]


def _train(workload, variant, settings, model, dataset, collate) -> dict:
    import torch

    from ..trainer import ORTTrainer, ORTTrainingArguments
    from .stats import step_stats
    from .timing import CountingCollator, ExportPeak, StepTimer

    timer, counter = StepTimer(), CountingCollator(collate)
    export_peak = ExportPeak(model)
    with tempfile.TemporaryDirectory(prefix="ort-hf-bench-") as out:
        args = ORTTrainingArguments(
            output_dir=out,
            max_steps=settings.warmup_steps + settings.steps_for(workload),
            per_device_train_batch_size=settings.batch_for(workload),
            learning_rate=settings.learning_rate,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=settings.seed,
            dataloader_num_workers=0,
            use_ort=variant.use_ort,
            torch_compile=variant.torch_compile,
            ort_memory_opt_level=variant.memory_opt_level,
            ort_cpu_dropout_kernels=variant.cpu_dropout_kernels,
            ort_cpu_weight_grad_swap=variant.cpu_weight_grad_swap,
            ort_cpu_linear_product_swap=variant.cpu_linear_product_swap,
            ort_enable_mem_reuse=variant.mem_reuse,
            ort_chunked_lm_loss=variant.chunked_lm_loss,
            ort_cpu_lm_head_forward_swap=variant.cpu_lm_head_forward_swap,
            ort_cpu_flash_attention=variant.cpu_flash_attention,
            ort_torch_threads_in_graph=variant.torch_threads_in_graph,
            ort_memory_budget_mb=settings.memory_budget_mb if variant.budget else None,
            ort_fallback="disable",  # never measure PyTorch while calling it ORT
            ort_intra_op_threads=settings.threads,  # ORT's pool would otherwise take every core
        )
        trainer = ORTTrainer(model=model, args=args, train_dataset=dataset, data_collator=counter, callbacks=[timer])
        try:
            output = trainer.train()
        except Exception as exc:  # a failed variant is a result, not a crash of the harness
            traceback.print_exc()
            return {"status": "failed", "reason": _reason(exc)}
        history = trainer.state.log_history
        engine_module = trainer.ort_engine
        threading = engine_module.session_threading() if engine_module is not None else None
    warm = settings.warmup_steps
    seconds = timer.cycles[warm:]
    compute = timer.seconds[warm:]
    batches = counter.batches[warm : warm + len(seconds)]
    total = sum(seconds)
    status = trainer.ort_engine_status()
    engine = status.backend if status is not None else ("torch.compile" if variant.torch_compile else "pytorch")
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]

    def last(key):
        values = [h[key] for h in history if key in h]
        return values[-1] if values else None

    steady = [h["memory/peak_mb"] for h in history if "memory/peak_mb" in h and h["step"] > warm]
    return {
        "status": "ok",
        "engine": engine,
        "fallback_reason": status.fallback_reason if status is not None else None,
        "measured_steps": len(seconds),
        "warmup_s": timer.cycles[:warm],
        "step_times_s": seconds,
        "compute_times_s": compute,
        "loop_overhead_median_s": statistics.median(c - s for c, s in zip(seconds, compute)) if seconds else None,
        "samples": sum(b[0] for b in batches),
        "non_padding_tokens": sum(b[1] for b in batches),
        "samples_per_s": sum(b[0] for b in batches) / total,
        # The Trainer's own clock for the whole run (warm-up and the export step included): what a
        # stopwatch around trainer.train() sees.
        "train_runtime_s": output.metrics["train_runtime"],
        "tokens_per_s": sum(b[1] for b in batches) / total,
        **step_stats(seconds),
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable_params_m": sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
        "run_peak_mb": last("memory/run_peak_mb"),
        # The memory observer's first step (ORT: export, session build and the first step).
        "first_step_peak_mb": last("ort/export_peak_mb"),
        "export_peak_mb": export_peak.peak_mb,
        "steady_peak_mb": max(steady) if steady else None,
        "export_s": last("ort/export_s"),
        "first_step_s": last("ort/first_step_s"),
        "label_sparsity": last("ort/label_sparsity"),
        "loss_in_graph": last("ort/loss_in_graph"),
        "budget_choice": {k: last(f"memory/budget_{k}") for k in ("level", "plans", "fits", "batch_size")},
        "losses": losses,
        "final_step": losses[-1][0] if losses else None,
        "final_loss": losses[-1][1] if losses else None,
        "torch_threads": torch.get_num_threads(),
        "ort_intra_op_threads": threading["threads"] if threading else None,
        "ort_intra_op_spinning": threading["spinning"] if threading else None,
        "torch_threads_in_graph": threading["torch_threads"] if threading else None,
    }


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    settings = _settings(ns)
    workload, variant = WORKLOADS[ns.workload], VARIANTS[ns.variant]
    started = time.perf_counter()
    try:
        result = run(workload, variant, settings)
    except Exception as exc:
        traceback.print_exc()
        result = {"status": "failed", "reason": _reason(exc)}
    result.update(
        workload=workload.name,
        variant=variant.name,
        round=ns.round,
        wall_s=time.perf_counter() - started,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        settings=settings.as_dict(),
    )
    Path(ns.result).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.result).write_text(json.dumps(result, indent=1))
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
