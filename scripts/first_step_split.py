"""Where ORT's first training step spends its time, against eager's first step (issue 44).

For each workload (the bench's: ``sst2-dynamic`` on the packaged MiniLM, ``clm`` on its tiny
Llama, ``lora-55m``...), one fresh process per engine trains ``--steps`` steps through ORTTrainer
(``use_ort`` true / false). In the ORT process the engine's stages are timed by wrapping ORT's and
ort_hf's own entry points (outermost, after ort_hf's patches): the engine import (onnxruntime, the
C++ extensions), the first-batch loss checks that place the loss, the pre-flight check, the export
(ORT's output-structure pass, a PyTorch forward, where it still runs, and torch.onnx.export's trace
and ONNX passes), the post-export processing (ONNX shape inference, ort_hf's graph rewrites), the
graph builder's initialisation, the gradient graph build and the session creation; what is left of
the first step is its forward and backward.

    python scripts/first_step_split.py --data_dir ../shared/data --workloads sst2-dynamic,clm \\
        --out docs/results/first-step/<cpu key>.json

prints a table and writes the raw timings as JSON. Each stage is timed twice: wall clock, and the
CPU time the process used (every thread's; ``time.process_time``), which other processes on a
busy machine inflate far less than the wall clock. A diagnostic, not a test: no figure is checked."""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (label, owner, attribute, static): the stages, in the order the first step reaches them.
STAGES = (
    (
        "loss placement: first-batch loss checks (PyTorch, 2 to 4 rows)",
        "ort_hf.trainer.first_step",
        "place_loss",
        False,
    ),
    ("pre-flight check (first batch in PyTorch)", "ort_hf.engine.preflight", "run_preflight", False),
    (
        "export: ORT's _export_model, less the two parts below",
        "onnxruntime.training.ortmodule._graph_transition_manager:GraphTransitionManager",
        "_export_model",
        True,
    ),
    (
        "  export, part: output-structure pass (a PyTorch forward)",
        "onnxruntime.training.ortmodule._io",
        "parse_outputs_for_onnx_export_and_extract_schema",
        False,
    ),
    ("  export, part: torch.onnx.export (trace, ONNX passes)", "torch.onnx", "export", False),
    (
        "post-export: shape inference, ort_hf rewrites",
        "onnxruntime.training.ortmodule._graph_transition_manager:GraphTransitionManager",
        "_post_export_process",
        True,
    ),
    (
        "graph builder init (pre-gradient passes)",
        "onnxruntime.training.ortmodule._graph_execution_manager:GraphExecutionManager",
        "_initialize_graph_builder",
        False,
    ),
    (
        "gradient graph build and optimisation",
        "onnxruntime.training.ortmodule._training_manager:TrainingManager",
        "_build_graph",
        False,
    ),
    (
        "session creation",
        "onnxruntime.training.ortmodule._training_manager:TrainingManager",
        "_create_execution_agent",
        False,
    ),
)


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


def _wrap_stages(times: dict[str, list[float]]) -> None:
    """Each stage's own [wall, CPU] seconds (a stage reached inside another, e.g. the export inside
    the pre-flight check, counts once, in its own line)."""
    import importlib

    stack: list[list[float]] = []  # per open stage: the [wall, CPU] its nested stages took

    for label, where, attr, static in STAGES:
        module_name, _, cls_name = where.partition(":")
        owner = importlib.import_module(module_name)
        if cls_name:
            owner = getattr(owner, cls_name)
        original = owner.__dict__[attr].__func__ if static else getattr(owner, attr)

        @functools.wraps(original)  # ORT passes autograd_inlining only where export's signature shows it
        def timed(*args, _original=original, _label=label, **kwargs):
            start = _clock()
            stack.append([0.0, 0.0])
            try:
                return _original(*args, **kwargs)
            finally:
                took = _since(start)
                nested = stack.pop()
                total = times.setdefault(_label, [0.0, 0.0])
                for i in (0, 1):
                    total[i] += took[i] - nested[i]
                    if stack:
                        stack[-1][i] += took[i]

        if cls_name:
            setattr(owner, attr, staticmethod(timed) if static else timed)
        else:  # a module function: patch it where the engine and the trainer call it from too
            setattr(owner, attr, timed)
            import ort_hf.engine.wrap as wrap_module
            import ort_hf.trainer.ort_trainer as trainer_module

            for caller in (wrap_module, trainer_module):
                if getattr(caller, attr, None) is original:
                    setattr(caller, attr, timed)


def worker(
    workload_name: str, engine: str, steps: int, data_dir: str, threads: int, cache_dir: str | None, shape: dict
) -> dict:
    import torch

    torch.set_num_threads(threads)
    from transformers import TrainerCallback

    from ort_hf.bench.data import build_dataset, collator_for, num_labels
    from ort_hf.bench.models import build_model, load_tokenizer
    from ort_hf.bench.spec import WORKLOADS, BenchSettings
    from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

    workload = WORKLOADS[workload_name]
    settings = BenchSettings(steps=steps, warmup_steps=1, threads=threads, data_dir=data_dir, **shape)
    tokenizer = load_tokenizer(settings)
    dataset = build_dataset(workload, settings, tokenizer)
    model = build_model(workload, settings, tokenizer, num_labels=num_labels(dataset) or 2)
    times: dict[str, list[float]] = {}
    if engine == "ort":
        from ort_hf.engine.runtime import ensure_engine

        start = _clock()
        ensure_engine()  # onnxruntime.training, ORTModule's patches and the C++ extensions
        times["engine import: onnxruntime, C++ extensions"] = list(_since(start))
        _wrap_stages(times)

    clocked: list[tuple[float, float]] = []  # (wall, CPU) of each step

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = _clock()

        def on_step_end(self, args, state, control, **kwargs):
            clocked.append(_since(self.start))

    with tempfile.TemporaryDirectory() as out:
        args = ORTTrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=settings.batch_for(workload),
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=0,
            dataloader_num_workers=0,
            use_ort=engine == "ort",
            ort_fallback="disable",
            ort_intra_op_threads=threads,
            ort_export_cache_dir=cache_dir,
        )
        trainer = ORTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            data_collator=collator_for(workload, tokenizer),
            callbacks=[StepClock()],
        )
        trainer.train()
        status = trainer.ort_engine_status()
    later = sorted(clocked[1:])
    return {
        "workload": workload_name,
        "engine": status.backend if status is not None else "pytorch",
        "export_cache": _cache_state(cache_dir),
        "first_step_s": list(clocked[0]),
        "steady_step_s": list(later[len(later) // 2]),
        "stages_s": times,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }


def _cache_state(cache_dir: str | None) -> str | None:
    """What the export cache folder holds after a run: None (no cache), "graph" (a complete entry,
    which a later run loads), "uncacheable" (ORT's graph holds PythonOps) or "empty"."""
    if not cache_dir:
        return None
    found = {p.name for p in Path(cache_dir).rglob("*")}
    if "uncacheable" in found:
        return "uncacheable"
    return "graph" if any(name.endswith(".complete") for name in found) else "empty"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="sst2-dynamic,clm")
    parser.add_argument("--data_dir", default="../shared/data")
    parser.add_argument("--steps", type=int, default=4, help="steps per run: the first, then steady ones")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of every process per workload, interleaved; the table gives each ratio's median and range "
        "over the rounds, each round's ORT first step over the same round's eager one",
    )
    parser.add_argument("--out", default=None, help="JSON file for the raw timings")
    parser.add_argument(
        "--export_cache",
        action="store_true",
        help="also time ORT with --ort_export_cache_dir: a first run fills a fresh temporary cache folder "
        "(timed too, as 'cache fill'), a second process loads from it ('cache hit')",
    )
    parser.add_argument(
        "--render_only", metavar="JSON", help="print the table of a raw JSON this script wrote; run nothing"
    )
    parser.add_argument("--model_dir", default=None, help="the workload's model from this folder (as ort-hf bench's)")
    parser.add_argument("--seq_len", type=int, default=None, help="the workload's sequence length unless given")
    parser.add_argument("--batch_size", type=int, default=None, help="the workload's batch size unless given")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "ENGINE"), help=argparse.SUPPRESS)
    parser.add_argument("--cache_dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render_only:
        print(render(json.loads(Path(args.render_only).read_text())))
        return 0
    if args.worker:
        shape = {"model_dir": args.model_dir, "seq_len": args.seq_len, "batch_size": args.batch_size}
        result = worker(*args.worker, args.steps, args.data_dir, args.threads, args.cache_dir, shape)
        print("RESULT " + json.dumps(result))
        return 0

    from ort_hf.bench.cpu import cpu_record

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = []
    for round_index in range(args.rounds):  # rounds interleaved: a slow spell of the machine hits every engine
        for workload in args.workloads.split(","):
            with tempfile.TemporaryDirectory() as cache:
                runs = [("eager", None, None), ("ort", None, None)]  # a fresh process each, as a user's run starts
                if args.export_cache:
                    runs += [("ort", cache, "cache fill"), ("ort", cache, "cache hit")]
                for engine, cache_dir, variant in runs:
                    command = [sys.executable, __file__, "--worker", workload, engine, "--steps", str(args.steps)]
                    command += ["--data_dir", args.data_dir, "--threads", str(args.threads)]
                    for flag in ("model_dir", "seq_len", "batch_size"):
                        if getattr(args, flag) is not None:
                            command += [f"--{flag}", str(getattr(args, flag))]
                    if cache_dir:
                        command += ["--cache_dir", str(Path(cache_dir) / "export-cache")]
                    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                    if line is None:
                        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                        return 1
                    results.append({**json.loads(line[len("RESULT ") :]), "variant": variant, "round": round_index})
    report = {
        "command": "python scripts/first_step_split.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M", time.gmtime()),
        "cpu": cpu_record(),
        "load_1min_at_end": os.getloadavg()[0],
        "results": results,
    }
    print(render(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


def render(report: dict) -> str:
    from ort_hf.bench.cpu import describe

    lines = [
        f"First step, {describe(report['cpu'])} ({report['date']}, 1-min load "
        f"{report['load_1min_at_end']:.2f} at the end); seconds as wall clock / CPU time of the process",
        "",
    ]
    # workload -> variant -> one run per round
    by_workload: dict[str, dict[str, list[dict]]] = {}
    for r in report["results"]:
        by_workload.setdefault(r["workload"], {}).setdefault(r.get("variant") or r["engine"], []).append(r)
    for workload, runs in by_workload.items():
        eager = runs.get("pytorch")
        for variant in ("ort", "cache fill", "cache hit"):
            if eager and variant in runs:
                if len(runs[variant]) == 1:
                    lines += _render_ort(workload, eager[0], runs[variant][0], variant)
                else:
                    lines += _render_rounds(workload, eager, runs[variant], variant)
    return "\n".join(lines)


def _stage_order() -> list[str]:
    return ["engine import: onnxruntime, C++ extensions", *(stage[0] for stage in STAGES)]


def _rest(ort: dict) -> list[float]:
    """What the stages leave of ORT's first step: its first forward and backward, the optimizer step."""
    inside = [0.0, 0.0]
    for label, pair in ort["stages_s"].items():
        if not label.startswith("engine import"):
            inside = [inside[0] + pair[0], inside[1] + pair[1]]
    return [ort["first_step_s"][i] - inside[i] for i in (0, 1)]


def _render_ort(workload: str, eager: dict, ort: dict, variant: str) -> list[str]:
    cache = f", export cache: {variant} ({ort['export_cache']} after the run)" if ort.get("export_cache") else ""
    lines = [
        f"{workload} ({ort['params_m']:.1f}M parameters{cache}): first step eager {_pair(eager['first_step_s'])}, "
        f"ORT {_pair(ort['first_step_s'])} (wall clock {ort['first_step_s'][0] / eager['first_step_s'][0]:.1f}x, "
        f"CPU time {ort['first_step_s'][1] / eager['first_step_s'][1]:.1f}x eager's); "
        f"later step eager {_pair(eager['steady_step_s'])}, ORT {_pair(ort['steady_step_s'])}"
    ]
    order = _stage_order()
    for label, pair in sorted(ort["stages_s"].items(), key=lambda item: order.index(item[0])):
        lines.append(f"  {label:<55} {_pair(pair)}")
    lines.append(f"  {'rest of the first step (forward, backward, optimizer)':<55} {_pair(_rest(ort))}")
    lines.append("")
    return lines


def _render_rounds(workload: str, eagers: list[dict], orts: list[dict], variant: str) -> list[str]:
    """Medians over the rounds; each ratio is a round's ORT run over the same round's eager run."""
    eager_by_round = {e.get("round", 0): e for e in eagers}
    paired = [(eager_by_round[o.get("round", 0)], o) for o in orts if o.get("round", 0) in eager_by_round]
    states = sorted({str(o.get("export_cache")) for _, o in paired})
    cache = f", export cache: {variant} ({' / '.join(states)} after the runs)" if variant != "ort" else ""
    ratios = [[o["first_step_s"][i] / e["first_step_s"][i] for e, o in paired] for i in (0, 1)]

    def med(pairs: list[list[float]]) -> list[float]:
        return [_median([p[i] for p in pairs]) for i in (0, 1)]

    lines = [
        f"{workload} ({orts[0]['params_m']:.1f}M parameters{cache}), {len(paired)} rounds: ORT's first step over "
        f"eager's, wall clock {_median(ratios[0]):.1f}x ({min(ratios[0]):.1f}–{max(ratios[0]):.1f}), CPU time "
        f"{_median(ratios[1]):.1f}x ({min(ratios[1]):.1f}–{max(ratios[1]):.1f}); medians: first step eager "
        f"{_pair(med([e['first_step_s'] for e, _ in paired]))}, ORT {_pair(med([o['first_step_s'] for _, o in paired]))}; "
        f"later step eager {_pair(med([e['steady_step_s'] for e, _ in paired]))}, "
        f"ORT {_pair(med([o['steady_step_s'] for _, o in paired]))}"
    ]
    lines.append(
        "  per round, wall s, eager / ORT: "
        + ", ".join(f"{e['first_step_s'][0]:.2f} / {o['first_step_s'][0]:.2f}" for e, o in paired)
    )
    labels = {label for _, o in paired for label in o["stages_s"]}
    for label in sorted(labels, key=_stage_order().index):
        lines.append(f"  {label:<55} {_pair(med([o['stages_s'].get(label, [0.0, 0.0]) for _, o in paired]))}")
    rest = med([_rest(o) for _, o in paired])
    lines.append(f"  {'rest of the first step (forward, backward, optimizer)':<55} {_pair(rest)}")
    lines.append("")
    return lines


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _pair(pair) -> str:
    return f"{pair[0]:6.2f} / {pair[1]:6.2f} s"


if __name__ == "__main__":
    sys.exit(main())
