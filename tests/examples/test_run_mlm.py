"""examples/run_mlm/run_mlm.py end to end, in subprocesses, on a slice of real WikiText-2 text.

Each mode (line by line, grouped texts) runs through ``--compare``: one ORT run
(``--ort_fallback disable``: it cannot pass by silently training in PyTorch) and one PyTorch run
of the same arguments, each in a fresh process. The two modes run concurrently: most of a run
is single-threaded (imports, ONNX export, ORT graph build), so this halves the wall time on 2 cores.
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
MODES = ("line_by_line", "grouped")


def _without_dropout(minilm_dir: Path, folder: Path) -> Path:
    """The packaged MiniLM with dropout 0 (weights and tokenizer linked): ORT and PyTorch draw
    dropout masks from different RNGs, so only without dropout must their numbers agree."""
    folder.mkdir()
    for item in minilm_dir.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((minilm_dir / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def runs(shared_data, minilm_dir, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    folder = tmp_path_factory.mktemp("run_mlm")
    lines = (shared_data / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8").splitlines(keepends=True)
    train, valid = folder / "train.raw", folder / "valid.raw"
    train.write_text("".join(lines[:120]), encoding="utf-8")
    valid.write_text("".join(lines[120:200]), encoding="utf-8")
    model = _without_dropout(minilm_dir, folder / "minilm")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(folder / "hf_datasets"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    procs = {}
    for mode in MODES:
        out = folder / mode
        argv = [
            "--model_name_or_path",
            str(model),
            "--train_file",
            str(train),
            "--validation_file",
            str(valid),
            "--do_train",
            "--do_eval",
            "--max_seq_length",
            "64",
            "--max_train_samples",
            "16",
            "--max_eval_samples",
            "16",
            "--per_device_train_batch_size",
            "4",
            "--per_device_eval_batch_size",
            "8",
            "--max_steps",
            "3",
            "--logging_steps",
            "1",
            "--seed",
            "0",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
            "--ort_fallback",
            "disable",
            "--ort_log_level",
            "ERROR",
            "--output_dir",
            str(out),
            "--compare",
        ] + (["--line_by_line"] if mode == "line_by_line" else [])
        log = open(folder / f"{mode}.log", "w+")
        procs[mode] = (
            subprocess.Popen(
                [sys.executable, str(SCRIPT), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=SCRIPT.parent,
            ),
            log,
            out,
        )
    results = {}
    for mode, (proc, log, out) in procs.items():
        proc.wait(timeout=400)
        log.seek(0)
        results[mode] = (proc.returncode, log.read(), out)
        log.close()
    return results


@pytest.mark.parametrize("mode", MODES)
def test_run_mlm_ort_and_pytorch(mode, runs):
    returncode, output, out = runs[mode]
    assert returncode == 0, output[-5000:]
    assert output.count("final metric (perplexity)") == 2, output[-3000:]  # both runs' summaries
    assert "=== ORT vs PyTorch" in output

    ort = json.loads((out / "ort" / "ort_hf_summary.json").read_text())
    pytorch = json.loads((out / "pytorch" / "ort_hf_summary.json").read_text())
    assert ort["engine"] == "ort", ort
    assert ort["label_sparsity"] is True, ort  # MLM labels are ~15% dense and ModuleWithLoss is on
    assert pytorch["engine"] == "pytorch" and pytorch["label_sparsity"] is None, pytorch
    for summary, name in ((ort, "ort"), (pytorch, "pytorch")):
        assert summary["metric_name"] == "perplexity"
        eval_results = json.loads((out / name / "eval_results.json").read_text())
        assert eval_results["perplexity"] == pytest.approx(math.exp(eval_results["eval_loss"]))
        assert summary["metric_value"] == eval_results["perplexity"]
        assert math.isfinite(summary["metric_value"]) and summary["metric_value"] > 1.0, summary
    # Same seed, same training masks, the same once-masked evaluation set, no dropout: the two
    # engines must land on the same perplexity (a random eval masking alone moves it by >1%).
    assert ort["metric_value"] == pytest.approx(pytorch["metric_value"], rel=1e-4), (ort, pytorch)
    assert ort["train_loss"] == pytest.approx(pytorch["train_loss"], rel=1e-4), (ort, pytorch)
