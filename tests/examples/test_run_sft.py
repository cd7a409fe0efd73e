"""examples/run_sft end to end: LoRA SFT with completion-only loss through ORT on SST-2 reviews."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "examples" / "run_sft"
pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")


def test_run_sft_trains_lora_through_ort(shared_data, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FOLDER))
    import run_sft

    out = tmp_path / "run"
    sst2 = shared_data / "glue" / "SST-2"
    assert (
        run_sft.main(
            [
                "--output_dir",
                str(out),
                "--max_steps",
                "2",
                "--per_device_train_batch_size",
                "4",
                "--train_file",
                str(sst2 / "train.tsv"),
                "--validation_file",
                str(sst2 / "dev.tsv"),
                "--max_train_samples",
                "16",
                "--max_eval_samples",
                "4",
                "--vocabulary",
                "bytes",
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
                "--gradient_checkpointing",
                "false",
            ]
        )
        == 0
    )
    summary = json.loads((out / "ort_hf_summary.json").read_text())
    assert summary["engine"] == "ort" and summary["head_on_used_rows"] is True
    assert 0 < summary["head_label_density"] < 0.2  # the completion is one label word (and the eos)
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    sys.modules.pop("run_sft", None)


def test_readme_figures_are_the_committed_results():
    """Every figure in run_sft's measured table comes from results/*.json (no hand-copied numbers)."""
    ort = json.loads((FOLDER / "results" / "ort.json").read_text())
    pt = json.loads((FOLDER / "results" / "pytorch.json").read_text())
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
        for line in (FOLDER / "README.md").read_text().splitlines()
        if re.match(r"\| (samples|peak|eval|train)", line)
    }

    def number(cell):
        return float(cell.replace(",", "").rstrip("x"))

    for key, row in (
        ("samples_per_s", "samples/s (median of logs)"),
        ("peak_memory_mb", "peak memory MB (per step)"),
        ("train_loss", "train loss (mean of the run)"),
        ("metric_value", "eval mean token accuracy"),
    ):
        ours, theirs, ratio = rows[row]
        assert abs(number(ours) - ort[key]) <= 0.51 * 10 ** -_decimals(ours), row
        assert abs(number(theirs) - pt[key]) <= 0.51 * 10 ** -_decimals(theirs), row
        assert abs(number(ratio) - ort[key] / pt[key]) <= 0.005, row


def _decimals(cell: str) -> int:
    return len(cell.rstrip("x").split(".")[1]) if "." in cell else 0
