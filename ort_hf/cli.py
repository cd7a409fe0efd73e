"""The `ort-hf` command: `ort-hf doctor` checks that the engine can train on this machine, `env` prints
what a bug report needs; `bench`, `report` and `sweep` measure it."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ort-hf", description="ort_hf: Hugging Face training on ONNX Runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, extensions (built when missing) and a one-step training check")
    sub.add_parser("env", help="versions, ORT build, extension and cache paths: one block for a bug report")
    report = sub.add_parser("report", help="PNG charts and a markdown summary from Trainer output dirs")
    report.add_argument("run_dirs", nargs="+", help="one or more Trainer output dirs (e.g. an ORT and a PyTorch run)")
    report.add_argument("--out", default=None, help="where to write (default: <first run>/report)")
    bench = sub.add_parser(
        "bench", help="throughput, memory and loss of ORT vs PyTorch, each variant in a fresh process"
    )
    try:
        from .bench.main import add_arguments as add_bench_arguments
    except ImportError:  # the bench extra is missing: said below, whatever the arguments
        bench.add_argument("arguments", nargs=argparse.REMAINDER)
    else:
        add_bench_arguments(bench)
    sweep = sub.add_parser(
        "sweep",
        help="every model type of transformers' Auto mappings, Trainer vs ORTTrainer on "
        "a tiny config (docs/architectures.md)",
    )
    from .sweep.main import add_arguments as add_sweep_arguments

    add_sweep_arguments(sweep)
    args = parser.parse_args(argv)
    if args.command in ("bench", "report"):
        try:
            if args.command == "bench":
                import datasets  # noqa: F401
            import matplotlib  # noqa: F401
        except ImportError as exc:
            print(f"ort-hf {args.command} needs the bench extra: pip install 'ort_hf[bench]' ({exc})", file=sys.stderr)
            return 2
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor()
    if args.command == "env":
        from .env_report import print_env

        return print_env()
    if args.command == "report":
        from .report import render_report

        out = render_report(args.run_dirs, args.out)
        print(f"ort-hf report: wrote {out}/report.md and charts")
        print((out / "report.md").read_text())
        return 0
    if args.command == "bench":
        from .bench.main import run as run_bench

        return run_bench(args, (sys.argv[1:] if argv is None else argv)[1:])
    if args.command == "sweep":
        from .sweep.main import run as run_sweep

        return run_sweep(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
