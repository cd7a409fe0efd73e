"""``ort-hf bench``: arguments, conditions of the run, and the outputs in ``--out``."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path

from .spec import BASELINE, DEFAULT_VARIANTS, VARIANTS, WORKLOADS, BenchSettings


def _at_least(low: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def _names(choices):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        default="outputs/bench",
        help="folder of results: this CPU kind's bench.md, bench.json, bench.png, runs/ and logs/ go "
        "to OUT/<cpu kind>/ (e.g. amd-epyc-avx512-family25-2cpu), beside other kinds' results, and OUT/by-cpu.md "
        "shows every kind's ratios side by side",
    )
    parser.add_argument(
        "--render_only",
        action="store_true",
        help="run nothing: rewrite OUT/by-cpu.md from the results already in OUT/*/bench.json "
        "(targets from --targets when given)",
    )
    parser.add_argument(
        "--workloads",
        type=_names(list(WORKLOADS)),
        default=list(WORKLOADS),
        help=f"comma-separated, from {', '.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--variants",
        type=_names(list(VARIANTS)),
        default=DEFAULT_VARIANTS,
        help=f"comma-separated, from {', '.join(VARIANTS)} (default: {', '.join(DEFAULT_VARIANTS)}; "
        f"'{BASELINE}' is added "
        "as the baseline)",
    )
    parser.add_argument(
        "--rounds", type=_at_least(1), default=3, help="fresh-process repeats of every variant (default 3)"
    )
    parser.add_argument(
        "--steps",
        type=_at_least(1),
        default=None,
        help="measured optimizer steps per run (default: 20; lora-200m 8, lora-485m 5)",
    )
    parser.add_argument(
        "--warmup_steps",
        type=_at_least(1),
        default=3,
        help="steps before measuring (at least 1: the first step exports the ORT graph or compiles)",
    )
    parser.add_argument("--batch_size", type=_at_least(1), default=None, help="default: 16 (mlm, sst2), 8 (clm)")
    parser.add_argument("--seq_len", type=_at_least(8), default=None, help="default: 128 (mlm, sst2), 256 (clm)")
    parser.add_argument(
        "--threads",
        type=_at_least(1),
        default=os.cpu_count() or 1,
        help="OMP_NUM_THREADS, torch threads and ORT's intra-op threads, the same for every variant "
        "(default: all cores)",
    )
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="dropout set in the model config and LoRA (default: the model's own, as users train; "
        "0 makes the engines' loss curves comparable)",
    )
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--model_dir", default=None, help="a HF model folder (default: the packaged MiniLM)")
    parser.add_argument(
        "--train_file",
        default=None,
        help="text file (mlm, clm), or CSV/TSV with a header or JSON lines (classification): text in sentence, "
        "text, or a pair (sentence1,sentence2; GLUE's #1 String,#2 String; question,sentence; "
        "premise,hypothesis), label in label/quality/gold_label (class ids or names)",
    )
    parser.add_argument(
        "--data_dir",
        default=None,
        help="folder holding wikitext-2-raw/ and glue/SST-2/ (without it or --train_file, the workloads are skipped)",
    )
    parser.add_argument(
        "--targets",
        default=None,
        help="a TOML file of targets to check the results against (format: ort_hf/bench/targets.py)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep successful runs already in --out/runs with the same settings (after an interruption)",
    )
    parser.add_argument(
        "--memory_budget_mb",
        type=float,
        default=None,
        help="memory budget (MB) of the ort-budget variant (ORTTrainer's --ort_memory_budget_mb)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a worker is stopped")


def _conditions(args, settings: BenchSettings, argv: list[str] | None, load_before, results, cpu: dict) -> dict:
    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    command = "ort-hf bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[2:]))
    return {
        "command": command.strip(),
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        # The same tree gives very different ratios on different CPUs: compare within one CPU kind.
        "cpu": cpu,
        "machine": f"{cpu['cores']} CPUs ({cpu['model']}; PyTorch's CPU kernels: {cpu['capability']}), "
        f"{platform.system()} {platform.release()}",
        "tree": _git_revision(),
        "versions": (
            f"Python {platform.python_version()}, torch {version('torch')}, transformers "
            f"{version('transformers')}, onnxruntime-training-cpu {version('onnxruntime-training-cpu')}"
        ),
        "threads": (
            f"OMP_NUM_THREADS={settings.threads}, MKL_NUM_THREADS={settings.threads}, "
            f"torch.set_num_threads({settings.threads}) and ORT's intra-op pool of {settings.threads} "
            "(--ort_intra_op_threads) in every worker"
        ),
        "settings": (
            f"{args.rounds} rounds, {settings.warmup_steps} warm-up + {settings.steps or 'workload default'} "
            "measured steps, "
            f"batch {settings.batch_size or 'workload default'}, seq {settings.seq_len or 'workload default'}, "
            f"dropout {'model default' if settings.dropout is None else settings.dropout}, "
            f"lr {settings.learning_rate}, seed {settings.seed}, "
            f"model {settings.model_dir or 'packaged MiniLM'}, data {settings.train_file or settings.data_dir}"
        ),
        "load average (1/5/15 min) at start": " ".join(f"{x:.2f}" for x in load_before),
        "load average at end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "runs kept from an earlier, interrupted invocation (--resume)": sum(bool(r.get("resumed")) for r in results),
        "1-min load when each worker started (min / median / max)": _spread(
            [r["load_1min_at_start"] for r in results if "load_1min_at_start" in r]
        ),
    }


def _git_revision() -> str:
    """The checkout the workers imported (``+dirty`` with local edits), or ``unknown``."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "ort_hf"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def _spread(values: list[float]) -> str:
    if not values:
        return "–"
    ordered = sorted(values)
    return f"{ordered[0]:.2f} / {ordered[len(ordered) // 2]:.2f} / {ordered[-1]:.2f}"


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from .by_cpu import write_by_cpu
    from .cpu import cpu_record
    from .render import bar_chart, markdown, write_json
    from .runner import run_all
    from .sources import BadModelDir
    from .summary import summarize
    from .tables import BadTable
    from .targets import BadTargets, check_targets, read_targets

    settings = BenchSettings(
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        threads=args.threads,
        dropout=args.dropout,
        learning_rate=args.learning_rate,
        model_dir=args.model_dir,
        train_file=args.train_file,
        data_dir=args.data_dir,
        memory_budget_mb=args.memory_budget_mb,
    )
    try:
        spec = read_targets(args.targets) if args.targets else {}
    except BadTargets as exc:
        raise SystemExit(f"ort-hf bench: {exc}") from None
    if args.render_only:
        path = write_by_cpu(Path(args.out), spec)
        if path is None:
            raise SystemExit(f"ort-hf bench --render_only: no results in {args.out}/*/bench.json")
        print(path.read_text())
        print(f"ort-hf bench: wrote {path}")
        return 0
    if "ort-budget" in args.variants and not args.memory_budget_mb:
        raise SystemExit("ort-hf bench: the ort-budget variant needs --memory_budget_mb (e.g. 30% below ort's peak).")
    variants = [BASELINE] + [v for v in args.variants if v != BASELINE]  # ratios need the baseline
    cpu = cpu_record()
    out = Path(args.out) / cpu["key"]  # a run on another CPU kind goes beside this one's, not over it
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    print(
        f"ort-hf bench: load average {load_before[0]:.2f} (a busy machine skews the numbers); "
        f"workers run one at a time, logs in {out / 'logs'}",
        flush=True,
    )
    try:
        results = run_all(
            args.workloads,
            variants,
            args.rounds,
            settings,
            out,
            args.timeout,
            echo=lambda line: print(line, flush=True),
            resume=args.resume,
        )
    except BadTable as exc:
        raise SystemExit(f"ort-hf bench: --train_file: {exc}") from None
    except BadModelDir as exc:
        raise SystemExit(f"ort-hf bench: {exc}") from None
    rows = summarize(results)
    goals = check_targets(spec, rows, settings.dropout)
    conditions = _conditions(args, settings, argv, load_before, results, cpu)
    text = markdown(rows, goals, conditions)
    (out / "bench.md").write_text(text)
    write_json(out / "bench.json", rows, goals, conditions, results)
    if any(r["status"] == "ok" for r in rows):
        bar_chart(out / "bench.png", rows)
    by_cpu = write_by_cpu(Path(args.out), spec)
    print(text)
    print(
        f"ort-hf bench: wrote {out / 'bench.md'}, {out / 'bench.json'}, {out / 'bench.png'}, and {by_cpu} "
        "(every CPU kind's results in the folder, side by side)"
    )
    return 0 if any(r["status"] == "ok" for r in rows) else 1
