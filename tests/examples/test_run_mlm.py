"""examples/run_mlm/run_mlm.py end to end, in subprocesses, on a slice of real WikiText-2 text.

Each mode runs through ``--compare``: one ORT run (``--ort_fallback disable``: it cannot pass by
silently training in PyTorch) and one PyTorch run of the same arguments, in fresh processes.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "run_mlm" / "run_mlm.py"


@pytest.fixture(scope="module")
def wiki_slice(shared_data, tmp_path_factory) -> dict[str, Path]:
    """The first lines of wiki.valid.raw as a train file and the next ones as a validation file."""
    lines = (shared_data / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8").splitlines(keepends=True)
    folder = tmp_path_factory.mktemp("wikitext")
    files = {"train": folder / "train.raw", "validation": folder / "valid.raw"}
    files["train"].write_text("".join(lines[:120]), encoding="utf-8")
    files["validation"].write_text("".join(lines[120:200]), encoding="utf-8")
    return files


@pytest.mark.parametrize("mode", ["line_by_line", "grouped"])
def test_run_mlm_ort_and_pytorch(mode, wiki_slice, minilm_dir, tmp_path):
    out = tmp_path / "out"
    argv = [
        "--model_name_or_path", str(minilm_dir),
        "--train_file", str(wiki_slice["train"]), "--validation_file", str(wiki_slice["validation"]),
        "--do_train", "--do_eval", "--max_seq_length", "64",
        "--max_train_samples", "24", "--max_eval_samples", "16",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--max_steps", "3",
        "--logging_steps", "1", "--seed", "0", "--report_to", "none", "--save_strategy", "no",
        "--disable_tqdm", "true", "--ort_fallback", "disable", "--ort_log_level", "ERROR",
        "--output_dir", str(out), "--compare",
    ]
    if mode == "line_by_line":
        argv.append("--line_by_line")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets"),
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env,
                          cwd=SCRIPT.parent, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("final metric (perplexity)") == 2, proc.stdout[-3000:]
    assert "=== ORT vs PyTorch" in proc.stdout

    ort = json.loads((out / "ort" / "ort_hf_summary.json").read_text())
    pytorch = json.loads((out / "pytorch" / "ort_hf_summary.json").read_text())
    assert ort["engine"] == "ort", ort
    assert ort["label_sparsity"] is True, ort  # MLM labels are ~15% dense and ModuleWithLoss is on
    assert pytorch["engine"] == "pytorch" and pytorch["label_sparsity"] is None, pytorch
    for summary, name in ((ort, "ort"), (pytorch, "pytorch")):
        assert summary["metric_name"] == "perplexity"
        ppl = summary["metric_value"]
        assert math.isfinite(ppl) and ppl > 1.0, summary
        eval_results = json.loads((out / name / "eval_results.json").read_text())
        assert eval_results["perplexity"] == pytest.approx(math.exp(eval_results["eval_loss"]))
        assert eval_results["perplexity"] == ppl
    # Same seed, same masked batches, same pre-masked evaluation set: after 3 steps only the
    # dropout masks (ORT's RNG vs torch's) separate the two runs.
    assert ort["metric_value"] == pytest.approx(pytorch["metric_value"], rel=0.05), (ort, pytorch)
