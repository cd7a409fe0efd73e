"""What ORTTrainer decides and reports once, on the first step of a new engine: where the loss is
computed (before the forward, since it decides what ORT exports), and after it the graph's facts:
ORT's recompute plans, padding removed, whether label sparsity fired and why not."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import weakref

import torch

from ..engine import (
    SPARSITY_THRESHOLD,
    HeadProducts,
    first_batch_memo,
    fused_loss_proven,
    ort_input_grad_wanted,
    ort_product_wanted,
    ort_weight_grad_wanted,
)
from ..module_with_loss import ModuleWithLoss
from ..module_with_loss.chunked_head import chunked_head_refusal, fused_in_graph
from ..module_with_loss.chunked_lm_loss import PRODUCTS, release_spare_buffer
from ..module_with_loss.fused_lm_head import FusedLMHeadModule, head_rows_report
from ..module_with_loss.loss_choice import choose_loss
from ..module_with_loss.module_with_loss import CROSS_ENTROPY

logger = logging.getLogger(__name__)


def place_loss(module, inputs: dict, num_items_in_batch, args, pythonop: bool) -> dict[str, float]:
    """Which loss the graph computes (``loss_choice``), and for ModuleWithLoss's cross-entropy,
    inside the ORT graph (label sparsity can fire), fused with a causal LM's head in the graph
    (``chunked_head``), or in PyTorch from ORT's logits; the facts to log.

    ORT 1.19.2's label sparsity fires below ``SPARSITY_THRESHOLD``. Above it there is
    nothing to drop, and ORT's CPU cross-entropy over every position (its gradient kernel is
    serial) is no faster than ``dense_cross_entropy`` in PyTorch. ``pythonop``: the engine runs
    autograd Functions as ORT PythonOps (the fused head is one)."""
    mode = args.ort_loss_in_graph
    if not isinstance(module, ModuleWithLoss):
        return {}  # TRL's fused head: its statistics are computed in the graph, on the used rows only
    labels = inputs.get("labels")
    # With the export cache, the first-batch checks' outcomes are recorded there for later runs.
    memo = first_batch_memo(args.ort_export_cache_dir, module.model, args.ort_export_cache_shared)
    choice = choose_loss(module, inputs, num_items_in_batch, memo)
    module.use(choice)
    if labels is not None:
        module.first_label_density = module.label_density(labels)
        module.sparse_first_labels = module.first_label_density < SPARSITY_THRESHOLD
    if choice.reason:
        logger.warning(
            "ort_hf: the model's own loss is trained, inside the ORT graph, with no label sparsity: %s.", choice.reason
        )
        module.loss_in_graph = True
    elif mode != "auto":
        module.loss_in_graph = mode == "always"
    elif module.loss_kind != CROSS_ENTROPY or labels.dim() < 2:
        module.loss_in_graph = True  # sequence-level labels or a user's loss: nothing to gain outside
    else:
        density = module.first_label_density
        module.loss_in_graph = args.ort_enable_label_sparsity and density < SPARSITY_THRESHOLD
        if not module.loss_in_graph:
            _place_dense_loss(module, inputs, density, args, pythonop, memo)
    return {
        "ort/loss_in_graph": float(module.loss_in_graph),
        "ort/model_loss": float(module.loss_kind != CROSS_ENTROPY),
        "ort/chunked_lm_loss": float(module.chunked_head),
    }


def _place_dense_loss(module, inputs: dict, density: float, args, pythonop: bool, memo) -> None:
    """Dense labels: the causal LM's head and loss fused in the graph where that is exact, else the loss
    in PyTorch from ORT's logits."""
    asked = args.ort_chunked_lm_loss
    if asked is False:
        refusal = "--ort_chunked_lm_loss is off"
    elif asked is None and not fused_loss_proven(module.model):
        refusal = (
            f"the architecture sweep has not proven it exact for {type(module.model).__name__} "
            "(--ort_chunked_lm_loss true to use it where the first batch's check passes)"
        )
    else:
        refusal = chunked_head_refusal(module, inputs, pythonop, memo)
    if refusal is None:
        module.loss_in_graph = module.chunked_head = True
        module.head_threads = torch.get_num_threads()  # here, outside ORT's graph: the process's own count
        weakref.finalize(module, release_spare_buffer).atexit = False  # the chunk buffer it keeps
        on_cpu = next(module.parameters()).device.type == "cpu"
        forward = on_cpu and ort_product_wanted(args.ort_cpu_lm_head_forward_swap)
        input_grad = on_cpu and ort_input_grad_wanted(args.ort_cpu_lm_head_input_grad_swap)
        weight_grad = on_cpu and ort_weight_grad_wanted(args.ort_cpu_lm_head_weight_grad_swap)
        if forward or input_grad or weight_grad:
            products = HeadProducts(
                module.head_threads, forward=forward, input_grad=input_grad, weight_grad=weight_grad
            )
            module.head_product = products.name
            PRODUCTS.setdefault(products.name, products)
        mm = "PyTorch's mm"
        logger.info(
            "ort_hf: label density %.1f%% (first batch): the LM head's projection and the cross-entropy "
            "run fused, in row chunks, inside the ORT graph (--ort_chunked_lm_loss), its forward product on "
            "%s (--ort_cpu_lm_head_forward_swap), its hidden-state gradient on %s "
            "(--ort_cpu_lm_head_input_grad_swap), its weight gradient on %s (--ort_cpu_lm_head_weight_grad_swap).",
            100 * density,
            "ORT's MatMul" if forward else mm,
            "ORT's MatMul" if input_grad else mm,
            "ORT's Gemm" if weight_grad else mm,
        )
        return
    logger.info(
        "ort_hf: loss computed in PyTorch from ORT's logits: label density %.1f%% (first batch) leaves "
        "label sparsity nothing to drop (--ort_loss_in_graph always to override), and the fused chunked "
        "head is not used: %s.",
        100 * density,
        refusal,
    )


def first_step_facts(engine, module, head_caller, labels: torch.Tensor | None, args) -> dict[str, float]:
    """The graph's facts after the engine's first step, logged (and returned for the run's first log)."""
    status = engine.engine_status()
    logs = {"ort/export_s": round(status.export_seconds, 3), "ort/fallback": float(status.backend == "pytorch")}
    logs.update(record_memory_plans(engine, args))
    stats = engine.padding_stats
    if stats["total_tokens"]:
        logger.info(
            "ort_hf: trimming trailing padding before ORT: the first batch kept %.1f%% of its token positions.",
            100 * stats["kept_tokens"] / stats["total_tokens"],
        )
    rewrite = engine.padding_rewrite
    logs["ort/padding_eliminated"] = float(rewrite is not None)
    if rewrite is not None:
        logger.info(
            "ort_hf: padding elimination: %d nodes of the graph run on the real tokens only (the "
            "padded layout rebuilt %d times, for attention and the outputs). --ort_eliminate_padding "
            "false turns it off.",
            rewrite.unpadded_nodes,
            rewrite.pads,
        )
    if isinstance(module, FusedLMHeadModule) and status.backend == "ort":
        logs.update(head_rows_report(engine.training_graph(), module, head_caller))
    if isinstance(module, ModuleWithLoss) and module.chunked_head and status.backend == "ort":
        graph = engine.training_graph()
        if graph is not None and not fused_in_graph(graph):
            raise RuntimeError(
                "ORT's graph does not run ort_hf's fused LM-head loss as a PythonOp, so its "
                "gradient is not the one computed for it: train with --ort_chunked_lm_loss false."
            )
    if (
        not isinstance(module, ModuleWithLoss)
        or labels is None
        or labels.dim() < 2
        or status.backend != "ort"
        or not module.loss_in_graph
        or module.loss_kind != CROSS_ENTROPY
    ):
        return logs  # sequence-level labels, or the loss runs in PyTorch: nothing for label sparsity to remove
    density = module.label_density(labels)  # as the loss sees them (after a causal shift)
    fired = bool(engine.label_sparsity_fired())
    logs.update({"ort/label_density": round(density, 4), "ort/label_sparsity": float(fired)})
    if fired:
        logger.warning(
            "ort_hf: label sparsity fired: ORT computes the loss on the %.1f%% of label positions "
            "that are not ignored (first batch).",
            100 * density,
        )
    elif density < SPARSITY_THRESHOLD:
        logger.warning(
            "ort_hf: label sparsity did not fire although label density is %.1f%%: %s",
            100 * density,
            why_no_label_sparsity(args, status),
        )
    else:
        logger.info(
            "ort_hf: label sparsity not needed: label density %.1f%% (ORT fires below %d%%).",
            100 * density,
            100 * SPARSITY_THRESHOLD,
        )
    return logs


MEMORY_PLANS_FILE = "ort_memory_plans.json"


def record_memory_plans(engine, args) -> dict[str, float]:
    """The recompute plans ORT found, when recompute is on: logged once, saved as JSON next to the
    checkpoints, counted in the returned metrics. With recompute off nothing is written, as with
    ``Trainer``."""
    if not engine.options.memory_optimizer_on:
        return {}
    plans = engine.memory_plans()
    if not plans:
        return {}
    on = [p for p in plans if p.enabled]
    if args.should_save:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, MEMORY_PLANS_FILE), "w") as f:
            json.dump([dataclasses.asdict(p) for p in plans], f, indent=2)
    rows = "\n".join(
        f"  {'ON ' if p.enabled else 'OFF'} {p.plan:<45} x{p.frequency:<3} {p.bytes_saved or 0:>14,.0f}" for p in plans
    )
    logger.info("ort_hf: ORT memory optimizer plans (first batch; bytes saved per step):\n%s", rows)
    return {"memory/plans_on": float(len(on)), "memory/plan_bytes_saved": float(sum(p.bytes_saved or 0 for p in on))}


def why_no_label_sparsity(args, status) -> str:
    if not args.ort_enable_label_sparsity:
        return "--ort_enable_label_sparsity is off."
    if not status.pythonop:
        return "ORT's PythonOp extension is unavailable (see `ort-hf doctor`)."
    return "ORT did not rewrite the loss; run with --ort_save_onnx and inspect the graph."
