"""The sweep's verdicts: one cell per (model type, task, mode) from the raw facts a worker recorded,
and the thresholds every verdict and the proven-architecture lists use (here only)."""

from __future__ import annotations

import math

LOSS_ATOL = 1e-4  # each step's loss, ORTTrainer vs Trainer, for parity
EXACT_GRAD_REL = 1e-4  # step-1 gradient relative error of a raw-mode parity that proves the engine exact
# ... of a rewrites-mode parity that proves padding trimming and elimination exact, and of a
# chunked_lm_loss-mode parity that proves the fused LM-head loss exact
REWRITES_GRAD_REL = 1e-5


# A float32 floor above this says more about the float64 run than about float32 (gradients that are
# zero or not finite in float64, a path that differs by dtype) and widens nothing.
FLOOR_MAX = 5e-5


def rewrite_bound(floor: float | None = None) -> float:
    """REWRITES_GRAD_REL, widened by twice the model's float32 floor (the reference's
    ``fp32_grad_floor``: PyTorch's own float32 gradients against float64's). Two float32 computations of
    one gradient, each that far from the exact one, can differ by twice as much; a model whose floor
    is 2e-5 cannot meet 1e-5 against Trainer in any engine but Trainer's own kernels. A record without a
    floor (an earlier sweep's, or a model that does not run in float64) or with one above FLOOR_MAX gets
    REWRITES_GRAD_REL alone."""
    counted = floor if floor is not None and 0 <= floor <= FLOOR_MAX else 0.0
    return REWRITES_GRAD_REL + 2 * counted


CELLS = ("parity", "refused", "crash-step1", "crash", "timeout", "diverge", "not-counted")


def _cell(cell: str, detail: str | None = None, step: int | None = None, **facts) -> dict:
    return {"cell": cell, "detail": detail, "step": step, **facts}


def classify(reference: dict, run: dict) -> dict:
    """``{"cell", "detail", "step", "max_loss_diff"}`` of one ORT run against Trainer's.

    ``reference``: Trainer's record (``status``, ``reason``, ``losses``). ``run``: the worker's
    record of the ORT run (``losses``, ``steps_done``, ``error``, ``backend``, ...) or the runner's
    for a process it stopped or saw die (``killed``: ``"timeout"`` or ``"died"``, ``detail``)."""
    if reference.get("status") != "ok":
        return _cell("not-counted", reference.get("reason") or "Trainer did not finish")
    if not all(math.isfinite(x) for x in reference.get("losses") or [math.nan]):
        return _cell("not-counted", f"Trainer's loss is not finite: {reference.get('losses')}")
    if run.get("batches_differ_at_step"):
        return _cell(
            "not-counted",
            f"harness: ORTTrainer got other batches than Trainer from step {run['batches_differ_at_step']}",
        )
    done = run.get("steps_done", 0)
    killed, error = run.get("killed"), run.get("error")
    if killed == "timeout":
        if done == 0:
            return _cell("timeout", run.get("detail") or "no step finished in time")
        return _cell("crash", f"timed out after step {done}: {run.get('detail') or ''}".rstrip(": "), done + 1)
    if killed:
        return _cell("crash-step1" if done == 0 else "crash", run.get("detail") or "the worker process died", done + 1)
    if error:
        detail = error.get("reason") or error.get("message")
        if done == 0:
            return _cell("refused" if error.get("from_ort_hf") else "crash-step1", detail, 1)
        return _cell("crash", detail, done + 1)
    return _compare_losses(reference["losses"], run)


def _compare_losses(expected: list[float], run: dict) -> dict:
    losses = run.get("losses", [])
    diffs = []
    for step, (want, got) in enumerate(zip(expected, losses), 1):
        if math.isfinite(want) != math.isfinite(got):
            return _cell("diverge", f"loss {got} where Trainer's is {want}", step, max_loss_diff=math.inf)
        diffs.append(abs(want - got))
    worst = max(diffs, default=0.0)
    over = next((i for i, d in enumerate(diffs, 1) if d > LOSS_ATOL), None)
    if over is not None:
        return _cell(
            "diverge",
            f"loss differs by {diffs[over - 1]:.1e} at step {over} (max {worst:.1e})",
            over,
            max_loss_diff=worst,
        )
    if len(losses) < len(expected):
        return _cell(
            "crash", f"stopped after {len(losses)} steps without an error", len(losses) + 1, max_loss_diff=worst
        )
    if run.get("backend") != "ort":
        # Not parity: nothing proves ORT computed these losses (fallback is disabled, so this is a defect).
        return _cell(
            "crash-step1",
            f"ORT never ran the steps: engine backend {run.get('backend')} "
            f"({run.get('fallback_reason') or 'no reason given'})",
            1,
            max_loss_diff=worst,
        )
    return _cell("parity", None, None, max_loss_diff=worst)


def _parity_within(run: dict | None, bound: float) -> bool:
    """A run at parity whose step-1 gradients are within ``bound`` (relative) of Trainer's."""
    error = (run or {}).get("grad_rel_error")
    return bool(run) and run.get("cell") == "parity" and error is not None and error <= bound


def engine_exact(raw: dict | None) -> bool:
    """Raw-mode parity with step-1 gradients within EXACT_GRAD_REL: the engine alone is exact."""
    return _parity_within(raw, EXACT_GRAD_REL)


PADDING_REWRITES = ("trim_padding", "eliminate_padding")  # proven_architectures.json's lists, one per rewrite


def rewrites_proven(rewrites: dict | None, floor: float | None = None) -> tuple[str, ...]:
    """The padding rewrites a rewrites-mode run proves exact: the run is at parity with step-1
    gradients within ``rewrite_bound(floor)``, and the rewrite acted in it (``trim_padding``: a position
    dropped; ``eliminate_padding``: a node run on the real tokens only). Both are forced on in that
    mode, so a rewrite that did not act (rows padded on the left, a masked LM's sparse labels) is
    proven by nothing, nor is either in a run that did not record what they did."""
    if not _parity_within(rewrites, rewrite_bound(floor)):
        return ()
    padding = rewrites.get("padding") or {}
    acted = {
        "trim_padding": padding.get("kept_tokens", 0) < padding.get("total_tokens", 0),
        "eliminate_padding": padding.get("unpadded_nodes", 0) > 0,
    }
    return tuple(r for r in PADDING_REWRITES if acted[r])


FUSED_LOSS = "chunked_lm_loss"  # proven_architectures.json's list for the fused chunked LM-head loss


def proves_fused_loss(run: dict | None, floor: float | None = None) -> bool:
    """A chunked_lm_loss-mode run proves the fused loss exact: at parity with step-1 gradients within
    ``rewrite_bound(floor)``, and the fused loss ran in ORT's graph. Where ORTTrainer's own check on the
    first batch kept the loss in PyTorch (logits that are not the head's projection), or the labels
    were sparse, the run proves nothing about it."""
    return _parity_within(run, rewrite_bound(floor)) and bool(run.get("chunked_lm_loss"))


def counts_against(run: dict | None, floor: float | None = None) -> bool:
    """A rewrites- or chunked_lm_loss-mode run that counts against what it forced on, for its class:
    counted, and not exact (a divergence, a crash, gradients off). A parity where nothing acted is
    neutral: it shows nothing either way."""
    if not run or run.get("cell") == "not-counted":
        return False
    return not _parity_within(run, rewrite_bound(floor))
