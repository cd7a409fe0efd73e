"""``ort-hf sweep --render``: docs/architectures.md (counts, one row per model type) and
ort_hf/engine/proven_architectures.json (the classes the sweep proves exact), from ``<out>/<task>.jsonl``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .cases import EVERY_MODE, MODES, SETTINGS, TASKS
from .cells import (
    CELLS,
    EXACT_GRAD_REL,
    FLOOR_MAX,
    FUSED_LOSS,
    LOSS_ATOL,
    PADDING_REWRITES,
    REWRITES_GRAD_REL,
    counts_against,
    engine_exact,
    proves_fused_loss,
    rewrite_bound,
    rewrites_proven,
)
from .messages import condense
from .results import read_results, results_path
from .waits_for import waits_for

SHOWN_MODE = "as shipped"  # the per-type table shows what users get
BOUND_NOTE = (
    "plus twice the model's float32 floor, how far PyTorch's own float32 gradients are from float64's, "
    f"where the case measured one of at most {FLOOR_MAX:g}"
)


def shipped_result(record: dict, proven: dict) -> dict | None:
    """What ORTTrainer's defaults do for this case once the proven lists are in place: a class proven
    exact skips the pre-flight (the ``raw`` run, or ``rewrites`` where those are proven too); any
    other class runs as the ``default`` mode ran it (pre-flight, no padding rewrite). A class proven for
    one rewrite only gets that one, which is the ``rewrites`` run too: the other did not act in it.
    A class proven for the fused LM-head loss gets it on dense labels: its ``chunked_lm_loss`` run."""
    modes, name = record["modes"], record.get("model_class")
    if name in proven[FUSED_LOSS] and FUSED_LOSS in modes:
        return modes[FUSED_LOSS]
    if any(name in proven[r] for r in PADDING_REWRITES) and "rewrites" in modes:
        return modes["rewrites"]
    if name in proven["exact"] and "raw" in modes:
        return modes["raw"]
    return modes.get("default")


def _short(detail: str | None) -> str:
    return condense(detail).replace("|", "\\|")


def cell_text(result: dict | None) -> str:
    if result is None:
        return "not run"
    cell = result["cell"]
    if cell == "parity":
        grads = result.get("grad_rel_error")
        if grads is not None and grads > EXACT_GRAD_REL:  # the losses agree, the step-1 gradients do not
            return f"parity (step-1 gradients off by {grads:.1e})"
        return "parity"
    if cell == "crash" and result.get("step"):
        return f"crash at step {result['step']}: {_short(result.get('detail'))}"
    if cell == "diverge":
        return f"diverge: {_short(result.get('detail'))}"
    return f"{cell.replace('not-counted', 'not counted')}: {_short(result.get('detail'))}"


def _load(out: Path) -> dict[str, dict[str, dict]]:
    return {task: records for task in TASKS if (records := read_results(results_path(out, task)))}


def _counts(results: dict[str, dict[str, dict]]) -> list[str]:
    lines = [
        "| task (mapping) | mode | types run | "
        + " | ".join(c.replace("not-counted", "not counted") for c in CELLS)
        + " |",
        "|---|---|---:|" + "---:|" * len(CELLS),
    ]
    proven = proven_lists(results)
    for task, records in results.items():
        for mode in (SHOWN_MODE, *MODES):
            if mode == SHOWN_MODE:
                shipped = [shipped_result(r, proven) for r in records.values()]
                cells = [c["cell"] for c in shipped if c is not None]
            else:
                cells = [r["modes"][mode]["cell"] for r in records.values() if mode in r["modes"]]
            if cells:
                lines.append(
                    f"| {task} (`{TASKS[task].mapping}`) | {mode} | {len(cells)} | "
                    + " | ".join(str(cells.count(c)) for c in CELLS)
                    + " |"
                )
    return lines


def _seconds(results: dict[str, dict[str, dict]]) -> list[str]:
    def median(values):
        values = [v for v in values if v is not None]
        return f"{statistics.median(values):.1f}" if values else "–"

    lines = [
        "| task | cases | whole case (one process, imports included) | Trainer's run | " + " | ".join(MODES) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(MODES),
    ]
    for task, records in results.items():
        rows = list(records.values())
        lines.append(
            f"| {task} | {len(rows)} | {median(r['wall_s'] for r in rows)} | "
            f"{median(r['reference'].get('wall_s') for r in rows)} | "
            + " | ".join(median(r["modes"].get(m, {}).get("wall_s") for r in rows) for m in MODES)
            + " |"
        )
    return lines


REWRITE_NAMES = {"trim_padding": "trim", "eliminate_padding": "elimination"}


def _floor(record: dict) -> float | None:
    """The record's float32 floor (cells.rewrite_bound), where its reference measured one."""
    return (record.get("reference") or {}).get("fp32_grad_floor")


def _why_not_exact(rewrites: dict, floor: float | None) -> str:
    grads = rewrites.get("grad_rel_error")
    if rewrites["cell"] == "parity" and grads is not None and grads > rewrite_bound(floor):
        return f"step-1 gradients off by {grads:.1e}"
    if rewrites["cell"] == "parity":
        return "neither acted"
    return rewrites["cell"].replace("not-counted", "not counted")


def _rewrites_note(by_task: dict[str, dict]) -> str:
    proofs = {t: rewrites_proven(r["modes"].get("rewrites"), _floor(r)) for t, r in by_task.items()}
    exact = [f"{t} ({', '.join(REWRITE_NAMES[r] for r in proofs[t])})" for t in by_task if proofs[t]]
    inexact = [
        f"{t} ({_why_not_exact(r['modes']['rewrites'], _floor(r))})"
        for t, r in by_task.items()
        if "rewrites" in r["modes"] and not proofs[t]
    ]
    if not exact and not inexact:
        return "not run"
    return "; ".join(
        filter(None, [f"exact: {', '.join(exact)}" if exact else "", f"not: {', '.join(inexact)}" if inexact else ""])
    )


def _swaps(results: dict[str, dict[str, dict]]) -> list[str]:
    """Per mode, how many runs at parity had each of ort_hf's kernel swaps in their training graph,
    out of the runs at parity that recorded what was swapped."""
    lines = ["| mode | runs at parity | swapped node | runs with it |", "|---|---:|---|---:|"]
    for mode in MODES:
        runs = [
            r["modes"][mode]
            for records in results.values()
            for r in records.values()
            if r["modes"].get(mode, {}).get("cell") == "parity" and r["modes"][mode].get("swapped") is not None
        ]
        counts: dict[str, int] = {}
        for run in runs:
            for node in run["swapped"]:
                counts[node] = counts.get(node, 0) + 1
        lines += [f"| {mode} | {len(runs)} | {node} | {n} |" for node, n in sorted(counts.items())]
    return lines


def _per_type(results: dict[str, dict[str, dict]]) -> list[str]:
    from .cases import model_types

    tasks = list(results)
    proven = proven_lists(results)
    in_mapping = {task: set(model_types(TASKS[task])) for task in tasks}
    types = sorted(set().union(*in_mapping.values())) if tasks else []
    lines = ["| model type | " + " | ".join(tasks) + " | padding rewrites exact |", "|---|" + "---|" * (len(tasks) + 1)]
    for model_type in types:
        cells = []
        for task in tasks:
            record = results[task].get(model_type)
            if model_type not in in_mapping[task]:
                cells.append("–")
            else:
                cells.append(cell_text(shipped_result(record, proven) if record else None))
        by_task = {t: results[t][model_type] for t in tasks if model_type in results[t]}
        lines.append(f"| {model_type} | " + " | ".join(cells) + f" | {_rewrites_note(by_task)} |")
    return lines


def _waiting(results: dict[str, dict[str, dict]]) -> list[str]:
    """One line per model type whose as-shipped cell is neither parity nor not counted, in any task."""
    proven = proven_lists(results)
    cells: dict[str, list[str]] = {}
    for task, records in results.items():
        for model_type, record in records.items():
            result = shipped_result(record, proven)
            if result is not None and result["cell"] not in ("parity", "not-counted"):
                cells.setdefault(model_type, []).append(f"{task} ({result['cell']})")
    lines = ["| model type | not at parity in | waits for |", "|---|---|---|"]
    lines += [f"| {t} | {', '.join(c)} | {waits_for(t)} |" for t, c in sorted(cells.items())]
    return lines


def _conditions(results: dict[str, dict[str, dict]]) -> str:
    records = [r for records in results.values() for r in records.values()]
    trees = sorted({m.get("tree", r.get("tree", "unknown")) for r in records for m in r["modes"].values()})
    versions = sorted({r.get("versions", "unknown") for r in records})
    return f"Results from tree {', '.join(trees)}; {'; '.join(versions)}."


def markdown(results: dict[str, dict[str, dict]]) -> str:
    s = SETTINGS
    task_modes = "; ".join(f"{t.name}: {', '.join(t.modes)}" for t in TASKS.values())
    modes = "\n".join(
        f"- `{m}`: {', '.join(f'{k}={v!r}' for k, v in o.items()) or 'ORTTrainer defaults'}" for m, o in MODES.items()
    )
    return "\n".join(
        [
            "# Architectures: ORTTrainer against Trainer, model type by model type",
            "",
            "<!-- Written by `ort-hf sweep --render` from docs/results/sweep/*.jsonl; do not edit by hand. -->",
            "",
            "For every model type of transformers' Auto mappings (one mapping per task), the sweep builds a tiny "
            "model from the type's own default config (sizes shrunk by the table in `ort_hf/sweep/tiny_config.py`, "
            "every dropout 0), and trains it twice from the same weights on the same batches: with `Trainer` and "
            f"with `ORTTrainer` ({', '.join(f'{k}={v!r}' for k, v in EVERY_MODE.items())}: no fallback, and every "
            "linear weight's gradient, forward product and input's gradient on PyTorch's product, as a real-sized "
            "model's are on an Intel CPU; the swap counts below say in how many cases they ran: a case recorded "
            "before the forward products could move ran them on ORT's). "
            f"{s.steps} steps of SGD (lr {s.learning_rate}, no "
            f"gradient clipping), batch {s.batch_size}, random rows {s.min_len}-{s.max_len} tokens long, padded on "
            f"the right to a multiple of {s.pad_to_multiple_of} by transformers' own collator for the task "
            "(`pad_to_multiple_of`: some columns are padding in every row, as users' padding to a multiple or to "
            "a maximum length leaves them; masked LM: the collator's seeded masking, the "
            "same in both runs). The `causal-lm-packed` task packs its rows instead, as `run_clm`'s "
            f"`group_texts` does: one length per batch, {s.packed_min_len}-{s.max_len} tokens, nothing padded, "
            "every label counted (dense labels, where the fused LM-head loss acts). Each task runs the modes "
            f"of its own ({task_modes}). "
            "Each case runs in its own process with a time limit per run.",
            "",
            "ORT runs once per mode, each from fresh weights:",
            "",
            modes,
            "",
            f"**{SHOWN_MODE}** is what ORTTrainer's defaults do with the lists below in place: a class proven "
            "exact skips the pre-flight, so its cell is its `raw` run (its `rewrites` run where the padding "
            f"rewrites are proven too, its `{FUSED_LOSS}` run where the fused loss is); every other class runs as the `default` mode ran it (pre-flight on "
            "the first batch, padding rewrites and fused loss off).",
            "",
            f"Cells: **parity** (every step's loss within {LOSS_ATOL:g} of Trainer's and ORT proven to have run), "
            "**refused** (ORTTrainer stopped before the first optimizer step with a message of its own), "
            "**crash-step1** (another error before the first optimizer step), **crash** (an error, hang or dead "
            "process after at least one step), **timeout** (no step finished in time), **diverge** (a loss off by "
            f"more than {LOSS_ATOL:g}, or finite on one side only), **not counted** (the tiny model cannot be built, "
            "or Trainer itself fails or gives a non-finite loss).",
            "",
            f"`ort_hf/engine/proven_architectures.json` lists the model classes with `raw` parity and step-1 "
            f"gradients within {EXACT_GRAD_REL:g} (relative, all parameters together), and `default` parity (the "
            "pre-flight passed at another length and row count), as `exact`, and those whose "
            f"`rewrites` mode is also parity with gradients within {REWRITES_GRAD_REL:g} ({BOUND_NOTE}) as `trim_padding` where the "
            "trim dropped a position in that run, and as `eliminate_padding` where the elimination ran a node on "
            "the real tokens only: each rewrite is on by default only for the classes listed for it. Those whose "
            f"`{FUSED_LOSS}` mode is parity with gradients within that bound and had the fused loss in "
            f"ORT's graph are listed as `{FUSED_LOSS}`: the fused loss is on by default, on dense labels, only "
            "for them. A class with "
            "a counted run against it in any task (a mode's run that is neither parity nor not counted) is not "
            "listed.",
            "",
            "Re-run: `make sweep` (every task and mode, two cases at a time, then this page), or e.g. "
            "`ort-hf sweep --tasks seq-cls --types bert,gpt2` followed by `ort-hf sweep --render`. Cases already "
            "in docs/results/sweep are kept unless `--redo`.",
            "",
            _conditions(results),
            "",
            "## Counts",
            "",
            *_counts(results),
            "",
            "## Median seconds per case",
            "",
            *_seconds(results),
            "",
            "## ort_hf's kernels in the graphs proven",
            "",
            "The op types ort_hf swapped for its own kernels in ORT's training graph (`cpu_kernel_swaps`), counted "
            "over the runs at parity.",
            "",
            *_swaps(results),
            "",
            "## Not at parity, and what each waits for",
            "",
            "Every model type whose as-shipped cell is refused, a crash, a timeout or diverge in some task, with "
            "what it waits for (`ort_hf/sweep/waits_for.py`).",
            "",
            *_waiting(results),
            "",
            f"## Model types ({SHOWN_MODE})",
            "",
            "`–`: the type is not in that task's mapping. The last column is the `rewrites` mode's verdict per task "
            f"(parity and step-1 gradients within {REWRITES_GRAD_REL:g}, {BOUND_NOTE}).",
            "",
            *_per_type(results),
            "",
        ]
    )


def proven_lists(results: dict[str, dict[str, dict]]) -> dict:
    """The classes each list proves, from every task's record of the class: at least one record proves
    it and none counts against it (a class that is the head of two tasks answers for both)."""
    proof: dict[str, set[str]] = {}
    against: dict[str, set[str]] = {}
    for records in results.values():
        for record in records.values():
            name, modes, floor = record["model_class"], record["modes"], _floor(record)
            raw, default, rewrites = modes.get("raw"), modes.get("default"), modes.get("rewrites")
            if engine_exact(raw) and (default or {}).get("cell") == "parity":
                proof.setdefault(name, set()).add("exact")
            elif any(run and run["cell"] != "not-counted" for run in (raw, default)):
                against.setdefault(name, set()).add("exact")
            if raw and raw["cell"] == "parity":
                proof.setdefault(name, set()).update(rewrites_proven(rewrites, floor))
            if counts_against(rewrites, floor):
                against.setdefault(name, set()).update(PADDING_REWRITES)
            if raw and raw["cell"] == "parity" and proves_fused_loss(modes.get(FUSED_LOSS), floor):
                proof.setdefault(name, set()).add(FUSED_LOSS)
            if counts_against(modes.get(FUSED_LOSS), floor):
                against.setdefault(name, set()).add(FUSED_LOSS)
    lists = {
        key: {n for n, keys in proof.items() if key in keys - against.get(n, set())}
        for key in ("exact", *PADDING_REWRITES, FUSED_LOSS)
    }
    return {
        "generated_by": "ort-hf sweep --render (ort_hf/sweep/render.py) from docs/results/sweep; do not edit by hand. "
        f"exact: raw-mode parity and step-1 gradient relative error <= {EXACT_GRAD_REL:g}, and "
        "default-mode (pre-flight) parity; "
        f"trim_padding, eliminate_padding: also rewrites-mode parity with error <= {REWRITES_GRAD_REL:g} ({BOUND_NOTE}), "
        f"where that rewrite acted; {FUSED_LOSS}: also {FUSED_LOSS}-mode parity with error within that bound, "
        "the fused loss in ORT's graph; no task's counted run against the class.",
        "exact": sorted(lists["exact"]),
        # a class not proven exact runs the pre-flight, rewrites and fused loss off
        **{key: sorted(lists[key] & lists["exact"]) for key in (*PADDING_REWRITES, FUSED_LOSS)},
    }


def render(out: Path, doc: Path, proven: Path) -> tuple[Path, Path]:
    results = _load(out)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(markdown(results))
    proven.parent.mkdir(parents=True, exist_ok=True)
    proven.write_text(json.dumps(proven_lists(results), indent=1) + "\n")
    return doc, proven
