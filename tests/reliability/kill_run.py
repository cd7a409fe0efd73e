"""Run by test_kill_resume: a checkpointing ORTTrainer run that resumes whatever it finds."""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.checks import last_complete_checkpoint


def main(out: str, max_steps: str) -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (256, 16), generator=gen)
    data = Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": [[1] * 16] * 256, "labels": (ids[:, 0] > 50).long().tolist()}
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=2,
        )
    )
    args = ORTTrainingArguments(
        output_dir=out,
        max_steps=int(max_steps),
        save_steps=5,
        save_total_limit=2,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        report_to=[],
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    trainer = ORTTrainer(model=model, args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=True if last_complete_checkpoint(out) else None)
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    (Path(out) / "losses.json").write_text(json.dumps(losses))


if __name__ == "__main__":
    main(*sys.argv[1:])
