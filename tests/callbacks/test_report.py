"""`ort-hf report` renders charts and a summary from real short runs (ORT and PyTorch)."""

import subprocess
import sys

from sst2 import sst2_dataset
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from ort_hf.report import load_run
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def _run(out, data, vocab, use_ort):
    import torch

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64, num_labels=2))
    args = ORTTrainingArguments(output_dir=str(out), max_steps=8, per_device_train_batch_size=16, logging_steps=2,
                                report_to=[], save_strategy="no", disable_tqdm=True, use_ort=use_ort,
                                ort_fallback="disable", ort_log_level="ERROR")
    trainer = ORTTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    trainer.save_state()


def test_report_from_two_real_runs(tmp_path, shared_data, minilm_dir):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    data = sst2_dataset(shared_data, tok, limit=128, max_length=64)  # padded to 64: density well below 1
    _run(tmp_path / "ort", data, tok.vocab_size, True)
    _run(tmp_path / "pytorch", data, tok.vocab_size, False)
    proc = subprocess.run([sys.executable, "-m", "ort_hf.cli", "report", str(tmp_path / "ort"),
                           str(tmp_path / "pytorch"), "--out", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in ("loss.png", "throughput.png", "memory.png", "density.png"):
        png = tmp_path / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
    summary = (tmp_path / "report" / "report.md").read_text()
    assert "| metric | ort | pytorch | pytorch / ort |" in summary
    density = load_run(tmp_path / "ort").values("density/embed")
    assert density and all(0.05 < d < 0.6 for d in density)
    assert "embedding density (mean)" in summary and "ORT export s" in summary
