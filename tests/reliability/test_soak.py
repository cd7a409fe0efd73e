"""2,000 MiniLM steps under ORT with both callbacks: no memory growth, no leaked file handles."""

import os

import pytest
import torch
from datasets import Dataset
from transformers import BertForSequenceClassification, TrainerCallback

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


class Probe(TrainerCallback):
    def __init__(self):
        self.samples = {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (200, 2000):
            self.samples[state.global_step] = (_rss_mb(), len(os.listdir("/proc/self/fd")))


@pytest.mark.slow
def test_two_thousand_steps_soak(tmp_path, minilm_dir):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 29000, (512, 16), generator=gen)
    data = Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": [[1] * 16] * 512, "labels": (ids[:, 1] % 2).tolist()}
    )
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    probe = Probe()
    args = ORTTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2000,
        per_device_train_batch_size=4,
        logging_steps=50,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    trainer = ORTTrainer(model=model, args=args, train_dataset=data, callbacks=[probe])
    trainer.train()
    assert trainer.ort_engine_status().backend == "ort"
    (rss_warm, fds_warm), (rss_end, fds_end) = probe.samples[200], probe.samples[2000]
    assert (rss_end - rss_warm) / rss_warm < 0.05, f"RSS {rss_warm:.0f} -> {rss_end:.0f} MB"
    assert fds_end <= fds_warm, f"file handles {fds_warm} -> {fds_end}"
