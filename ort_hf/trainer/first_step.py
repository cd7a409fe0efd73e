"""What ORTTrainer reports once, after the first training step: ORT's recompute plans, and why
label sparsity did not fire when it could have."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

logger = logging.getLogger(__name__)

MEMORY_PLANS_FILE = "ort_memory_plans.json"


def record_memory_plans(engine, args) -> dict[str, float]:
    """The recompute plans ORT found, when recompute is on: logged once, saved as JSON next to the
    checkpoints, counted in the returned metrics. With recompute off nothing is written, as with
    ``Trainer``."""
    plans = engine.memory_plans()
    if not plans or not engine.options.memory_optimizer_on:
        return {}
    on = [p for p in plans if p.enabled]
    if args.should_save:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, MEMORY_PLANS_FILE), "w") as f:
            json.dump([dataclasses.asdict(p) for p in plans], f, indent=2)
    rows = "\n".join(f"  {'ON ' if p.enabled else 'OFF'} {p.plan:<45} x{p.frequency:<3} {p.bytes_saved or 0:>14,.0f}"
                     for p in plans)
    logger.info("ort_hf: ORT memory optimizer plans (first batch; bytes saved per step):\n%s", rows)
    return {"memory/plans_on": float(len(on)), "memory/plan_bytes_saved": float(sum(p.bytes_saved or 0 for p in on))}


def why_no_label_sparsity(args, status) -> str:
    if not args.ort_enable_label_sparsity:
        return "--ort_enable_label_sparsity is off."
    if not status.pythonop:
        return "ORT's PythonOp extension is unavailable (see `ort-hf doctor`)."
    return "ORT did not rewrite the loss; run with --ort_save_onnx and inspect the graph."
