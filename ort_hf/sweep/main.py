"""``ort-hf sweep``: arguments, the plan of cases, parallel workers, progress; ``--render`` writes the docs."""

from __future__ import annotations

import argparse
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from .cases import DEFAULT_TASKS, MODES, TASKS

DEFAULT_OUT = "docs/results/sweep"
DEFAULT_DOC = "docs/architectures.md"
DEFAULT_PROVEN = "ort_hf/engine/proven_architectures.json"


def _names(choices):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if choices is not None and n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tasks",
        type=_names(list(TASKS)),
        default=list(DEFAULT_TASKS),
        help=f"comma-separated, from {', '.join(TASKS)} (default: all)",
    )
    parser.add_argument(
        "--modes",
        type=_names(list(MODES)),
        default=list(MODES),
        help=f"comma-separated, from {', '.join(MODES)} (default: all; each task runs those of its own)",
    )
    parser.add_argument(
        "--types",
        type=_names(None),
        default=None,
        help="comma-separated model types, e.g. bert,gpt2 (default: every type of each task's mapping)",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"folder of the <task>.jsonl results (default {DEFAULT_OUT})"
    )
    parser.add_argument("--logs", default="outputs/sweep/logs", help="folder of the workers' logs, one per case")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once, one process each (default 2)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        help="seconds Trainer's run or one mode of a case may take before it is stopped (default 240)",
    )
    parser.add_argument(
        "--no-fork",
        dest="fork",
        action="store_false",
        help="start each worker as a new Python process instead of forking it from this one, "
        "which imports torch, transformers and ORT once for all of them",
    )
    parser.add_argument("--redo", action="store_true", help="run cases again that --out already holds")
    parser.add_argument(
        "--render",
        action="store_true",
        help=f"run nothing: write {DEFAULT_DOC} and {DEFAULT_PROVEN} from the results in --out",
    )
    parser.add_argument("--doc", default=DEFAULT_DOC, help="where --render writes the table")
    parser.add_argument("--proven", default=DEFAULT_PROVEN, help="where --render writes the proven class names")


def plan(tasks: list[str], types: list[str] | None) -> list[tuple[str, str]]:
    """(task, model type) in run order: task by task, types sorted."""
    from .cases import model_types

    order = []
    for task in tasks:
        available = model_types(TASKS[task])
        chosen = available if types is None else [t for t in types if t in available]
        order += [(task, t) for t in sorted(chosen)]
    return order


def _versions() -> str:
    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"torch {version('torch')}, transformers {version('transformers')}, "
        f"onnxruntime-training-cpu {version('onnxruntime-training-cpu')}"
    )


def _progress(i: int, n: int, record: dict) -> str:
    from .messages import condense

    cells = ", ".join(
        f"{mode} {r['cell']}" + (f" ({condense(r['detail'], 100)})" if r["cell"] != "parity" else "")
        for mode, r in record["modes"].items()
    )
    return (
        f"[{i}/{n}] {record['task']} / {record['model_type']} ({record['model_class'] or '?'}): {cells}; "
        f"{record['wall_s']:.0f} s"
    )


def run(args: argparse.Namespace) -> int:
    if args.render:
        from .render import render

        doc, proven = render(Path(args.out), Path(args.doc), Path(args.proven))
        print(f"ort-hf sweep: wrote {doc} and {proven}")
        return 0
    from ..bench.main import _git_revision
    from .results import merge, missing_modes, read_results, results_path, write_results
    from .runner import run_case

    out, logs = Path(args.out), Path(args.logs)
    stored = {task: read_results(results_path(out, task)) for task in args.tasks}
    cases = [
        (task, t, missing_modes(stored[task].get(t), [m for m in args.modes if m in TASKS[task].modes], args.redo))
        for task, t in plan(args.tasks, args.types)
    ]
    todo = [c for c in cases if c[2]]
    skipped = len(cases) - len(todo)
    if args.types:
        absent = sorted({t for t in args.types} - {t for _, t, _ in cases})
        if absent:
            print(f"ort-hf sweep: not in the chosen tasks' mappings: {', '.join(absent)}")
    print(
        f"ort-hf sweep: {len(todo)} cases to run ({skipped} already in {out}; --redo runs them again), "
        f"{args.jobs} at a time, logs in {logs}",
        flush=True,
    )
    tree, versions, lock, finished = _git_revision(), _versions(), threading.Lock(), [0]

    def one(case):
        task, model_type, modes = case
        record = run_case(task, model_type, modes, args.timeout, logs / task / f"{model_type}.log", args.fork)
        record.update(tree=tree, versions=versions)
        for result in record["modes"].values():
            result["tree"] = tree  # a later run of some modes leaves the others' tree as it was
        with lock:
            stored[task][model_type] = merge(stored[task].get(model_type), record)  # modes not run are kept
            write_results(results_path(out, task), stored[task])
            finished[0] += 1
            print(_progress(finished[0], len(todo), record), flush=True)

    if args.fork and todo:
        from .runner import preload

        preload()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, todo))
    return 0
