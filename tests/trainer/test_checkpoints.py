"""Checkpoints are plain HF checkpoints, and resume in a new process continues the same run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from sst2 import sst2_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForSequenceClassification

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

HERE = Path(__file__).resolve().parent


def _run(shared_data, minilm_dir, out, resume, losses_path):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "resume_run.py"),
            str(shared_data),
            str(minilm_dir),
            str(out),
            resume,
            str(losses_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {int(k): v for k, v in json.loads(Path(losses_path).read_text()).items()}


def test_resume_in_new_process_matches_uninterrupted_run(shared_data, minilm_dir, tmp_path):
    full = _run(shared_data, minilm_dir, tmp_path / "full", "", tmp_path / "full.json")
    assert sorted(full) == list(range(1, 21))
    checkpoint = tmp_path / "full" / "checkpoint-10"
    assert (checkpoint / "optimizer.pt").exists() and (checkpoint / "scheduler.pt").exists()
    resumed = _run(shared_data, minilm_dir, tmp_path / "resumed", str(checkpoint), tmp_path / "resumed.json")
    # The resumed state carries steps 1-10 from the checkpoint's trainer_state.json.
    assert sorted(resumed) == list(range(1, 21))
    for step in range(11, 21):
        assert abs(resumed[step] - full[step]) <= 1e-5, (step, resumed[step], full[step])


def test_saved_model_loads_in_plain_transformers(shared_data, minilm_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    dataset = sst2_dataset(shared_data, tok, limit=64)
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=2,
        )
    )
    args = ORTTrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=5,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    trainer = ORTTrainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert "classifier.weight" in keys and not any(k.startswith(("module.", "_ort", "model.")) for k in keys)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved").eval()
    model.eval()
    batch = tok(["a gripping , beautiful film", "dull and lifeless"], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits, rtol=0, atol=1e-5)
