"""examples/run_clm end to end: LoRA through ORT on WikiText lines, adapter saved as PEFT's."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("peft", reason="peft is not installed (pip install 'ort_hf[peft]')")


def test_run_clm_trains_lora_through_ort(shared_data, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "run_clm"))
    import run_clm

    out = tmp_path / "run"
    assert (
        run_clm.main(
            [
                "--output_dir",
                str(out),
                "--max_steps",
                "2",
                "--per_device_train_batch_size",
                "4",
                "--train_file",
                str(shared_data / "wikitext-2-raw" / "wiki.test.raw"),
                "--validation_file",
                str(shared_data / "wikitext-2-raw" / "wiki.valid.raw"),
                "--max_train_samples",
                "16",
                "--max_eval_samples",
                "8",
                "--tiny_hidden_size",
                "32",
                "--tiny_layers",
                "1",
                "--report_to",
                "none",
                "--save_strategy",
                "no",
                "--ort_fallback",
                "disable",
                "--disable_tqdm",
                "true",
                "--logging_steps",
                "1",
            ]
        )
        == 0
    )
    summary = json.loads((out / "ort_hf_summary.json").read_text())
    assert summary["engine"] == "ort" and summary["label_sparsity"] is True
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    sys.modules.pop("run_clm", None)


def test_readme_figures_are_the_committed_results():
    """Every figure in run_clm's measured table comes from results/*.json (no hand-copied numbers)."""
    import re

    folder = ROOT / "examples" / "run_clm"
    ort = json.loads((folder / "results" / "ort.json").read_text())
    pt = json.loads((folder / "results" / "pytorch.json").read_text())
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
        for line in (folder / "README.md").read_text().splitlines()
        if re.match(r"\| (samples|peak|perplexity)", line)
    }

    def number(cell):
        return float(cell.replace(",", "").rstrip("x"))

    for key, row in (
        ("samples_per_s", "samples/s (median of logs)"),
        ("peak_memory_mb", "peak memory MB (per step)"),
        ("metric_value", "perplexity (256 valid. lines)"),
    ):
        ours, theirs, ratio = rows[row]
        assert abs(number(ours) - ort[key]) <= 0.51 and abs(number(theirs) - pt[key]) <= 0.51, row
        assert abs(number(ratio) - ort[key] / pt[key]) <= 0.005, row
