"""examples/run_glue: end to end on real SST-2 and MRPC slices (ORT and PyTorch), its GLUE
metric against sklearn / scipy, and its TSV reader on the quirks of the real files."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

SCRIPT_DIR = Path(__file__).resolve().parents[2] / "examples" / "run_glue"
SCRIPT = SCRIPT_DIR / "run_glue.py"
sys.path.insert(0, str(SCRIPT_DIR))

import glue_metric  # noqa: E402
from glue_data import GLUE_TASKS, read_glue_split, read_tsv  # noqa: E402

# --- end to end ----------------------------------------------------------------------------
# Four runs of the script (SST-2 through --compare, MRPC with --use_ort true / false), in two
# chains side by side, one thread each: the module's wall time is about half the sequential one.


def _glue_args(minilm_dir, data_dir, task, out):
    return [
        "--model_name_or_path",
        str(minilm_dir),
        "--task_name",
        task,
        "--data_dir",
        str(data_dir),
        "--do_train",
        "--do_eval",
        "--max_seq_length",
        "32",
        "--pad_to_max_length",
        "false",
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "64",
        "--max_steps",
        "3",
        "--per_device_train_batch_size",
        "16",
        "--per_device_eval_batch_size",
        "32",
        "--logging_steps",
        "1",
        "--learning_rate",
        "5e-5",
        "--seed",
        "7",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--ort_fallback",
        "disable",
        "--ort_log_level",
        "ERROR",
        "--output_dir",
        str(out),
    ]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=400)


@pytest.fixture(scope="module")
def glue_runs(tmp_path_factory, shared_data, minilm_dir):
    root = tmp_path_factory.mktemp("run_glue")
    sst2 = _glue_args(minilm_dir, shared_data / "glue" / "SST-2", "sst2", root / "sst2")
    mrpc = {
        engine: _glue_args(minilm_dir, shared_data / "glue" / "MRPC", "mrpc", root / f"mrpc_{engine}")
        + ["--use_ort", "true" if engine == "ort" else "false"]
        for engine in ("ort", "pytorch")
    }
    mrpc["ort"] += ["--export_onnx", str(root / "mrpc_onnx")]

    def mrpc_chain():
        return {engine: _run(mrpc[engine]) for engine in ("ort", "pytorch")}

    with ThreadPoolExecutor(max_workers=2) as pool:
        sst2_future = pool.submit(_run, ["--compare", *sst2])
        mrpc_future = pool.submit(mrpc_chain)
        procs = {"sst2": sst2_future.result(), **{f"mrpc_{k}": v for k, v in mrpc_future.result().items()}}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    dirs = {
        "sst2_ort": root / "sst2" / "ort",
        "sst2_pytorch": root / "sst2" / "pytorch",
        "mrpc_ort": root / "mrpc_ort",
        "mrpc_pytorch": root / "mrpc_pytorch",
    }
    return procs, dirs, root


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "ort_hf_summary.json").read_text())


@pytest.mark.parametrize("task,metric", [("sst2", "eval_accuracy"), ("mrpc", "eval_f1")])
@pytest.mark.parametrize("engine", ["ort", "pytorch"])
def test_run_reports_metric_and_engine(glue_runs, task, metric, engine):
    procs, dirs, _ = glue_runs
    stdout = procs[task if task == "sst2" else f"{task}_{engine}"].stdout
    summary = _summary(dirs[f"{task}_{engine}"])
    assert summary["engine"] == engine  # "ort" only when ORT really trained (fallback disabled)
    assert summary["metric_name"] == metric and 0.0 <= summary["metric_value"] <= 1.0
    assert f"final metric ({metric})" in stdout
    assert summary["samples_per_s"] > 0 and summary["train_loss"] > 0
    eval_results = json.loads((dirs[f"{task}_{engine}"] / "eval_results.json").read_text())
    assert eval_results["eval_samples"] == 64 and eval_results[metric] == summary["metric_value"]
    if task == "mrpc":  # MRPC is scored with F1 and accuracy, as GLUE does
        assert {"eval_accuracy", "eval_f1", "eval_combined_score"} <= set(eval_results)
    state = json.loads((dirs[f"{task}_{engine}"] / "trainer_state.json").read_text())  # `ort-hf report` input
    assert state["global_step"] == 3 and any("loss" in h for h in state["log_history"])
    if engine == "ort":
        assert summary["export_s"] is not None


def test_metric_source_logged_once(glue_runs):
    procs, _, _ = glue_runs
    for name in ("mrpc_ort", "mrpc_pytorch"):
        lines = [line for line in procs[name].stdout.splitlines() if "GLUE metric:" in line]
        assert len(lines) == 1, lines


def test_compare_prints_both_engines(glue_runs):
    procs, dirs, _ = glue_runs
    out = procs["sst2"].stdout
    assert "=== ORT vs PyTorch" in out and "--use_ort true" in out and "--use_ort false" in out
    assert _summary(dirs["sst2_ort"])["engine"] == "ort" and _summary(dirs["sst2_pytorch"])["engine"] == "pytorch"


def test_export_onnx_after_training(glue_runs):
    _, _, root = glue_runs
    onnx_dir = root / "mrpc_onnx"
    assert (onnx_dir / "model.onnx").stat().st_size > 1_000_000
    assert json.loads((onnx_dir / "config.json").read_text())["id2label"] == {"0": "not_equivalent", "1": "equivalent"}


# --- the GLUE metric -----------------------------------------------------------------------
def _prediction_set():
    """A fixed set: 200 binary and 3-class predictions, and STS-B scores with ties."""
    rng = np.random.default_rng(1234)
    labels = rng.integers(0, 2, 200)
    preds = np.where(rng.random(200) < 0.8, labels, 1 - labels)
    labels3 = rng.integers(0, 3, 200)
    preds3 = np.where(rng.random(200) < 0.6, labels3, rng.integers(0, 3, 200))
    scores = np.round(rng.uniform(0, 5, 200) * 5) / 5  # steps of 0.2, like STS-B gold scores: many ties
    predicted = np.round(scores + rng.normal(0, 0.8, 200), 1)  # ties as well
    return labels, preds, labels3, preds3, scores, predicted


def test_local_metric_gives_what_evaluates_glue_module_gives():
    """evaluate's glue module (glue.py): accuracy as (preds == labels).mean(), sklearn's F1 and
    Matthews correlation, scipy's Pearson and Spearman on float32 for STS-B."""
    from scipy import stats
    from sklearn import metrics

    labels, preds, labels3, preds3, scores, predicted = _prediction_set()
    assert glue_metric.compute("sst2", preds, labels) == {"accuracy": float((preds == labels).mean())}
    assert glue_metric.compute("mnli", preds3, labels3) == {"accuracy": metrics.accuracy_score(labels3, preds3)}
    assert glue_metric.compute("mrpc", preds, labels) == {
        "accuracy": metrics.accuracy_score(labels, preds),
        "f1": metrics.f1_score(labels, preds),
    }
    assert glue_metric.compute("cola", preds3, labels3) == {
        "matthews_correlation": metrics.matthews_corrcoef(labels3, preds3)
    }
    p32, s32 = predicted.astype(np.float32), scores.astype(np.float32)
    assert glue_metric.compute("stsb", predicted, scores) == {
        "pearson": float(stats.pearsonr(p32, s32)[0]),
        "spearmanr": float(stats.spearmanr(p32, s32)[0]),
    }
    with pytest.raises(KeyError, match="unknown GLUE metric config"):
        glue_metric.compute("squad", preds, labels)


def test_metric_loads_offline_without_waiting_on_the_network(monkeypatch, caplog):
    """Offline, evaluate.load either finds glue in its module cache or fails at once, and the
    script falls back to glue_metric.py saying so in one log line."""
    import run_glue

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")  # what load_glue_metric sets; restored afterwards
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    caplog.set_level(logging.INFO, logger="run_glue")
    start = time.perf_counter()
    metric = run_glue.load_glue_metric("mrpc")
    assert time.perf_counter() - start < 3.0  # no hub retries or timeouts
    assert len([r for r in caplog.records if "GLUE metric:" in r.getMessage()]) == 1
    if isinstance(metric, glue_metric.LocalGlueMetric):
        pytest.skip("evaluate's glue metric is not in the local module cache (no hub here): nothing to compare with")
    labels, preds, *_ = _prediction_set()
    for task in ("mrpc", "cola", "sst2"):
        expected = evaluate.load("glue", task).compute(predictions=preds, references=labels)
        assert glue_metric.compute(task, preds, labels) == pytest.approx(expected, rel=1e-12)
    _, _, _, _, scores, predicted = _prediction_set()
    expected = evaluate.load("glue", "stsb").compute(predictions=predicted, references=scores)
    assert glue_metric.compute("stsb", predicted, scores) == pytest.approx(expected, rel=1e-6)


# --- the TSV reader ------------------------------------------------------------------------
def test_tsv_reader_bom_unbalanced_quote_and_broken_rows(tmp_path, caplog):
    path = tmp_path / "dev.tsv"
    path.write_bytes(
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t11\t12\tHe said " the witness was there .\tThe witness , he said , was there .\n'
        '0\t13\t14\tShares fell 5 % .\t" Shares rose , " a trader said .\n'
        "1\t15\t16\ta broken row with a missing column\n".encode("utf-8")
    )
    assert read_tsv(path)[0][0] == "Quality"  # the byte-order mark is gone
    caplog.set_level(logging.WARNING, logger="glue_data")
    data = read_glue_split(GLUE_TASKS["mrpc"], path)
    assert data == {
        "sentence1": ['He said " the witness was there .', "Shares fell 5 % ."],
        "sentence2": ["The witness , he said , was there .", '" Shares rose , " a trader said .'],
        "label": [1, 0],
    }
    assert "skipped 1 malformed row(s) of 3" in caplog.text


def test_tsv_reader_header_less_cola_and_named_mnli_labels(tmp_path):
    cola = tmp_path / "cola.tsv"
    cola.write_text("gj04\t1\t\tThe sailors rode the breeze clear of the rocks .\ngj04\t0\t*\tThe more books I ask .\n")
    assert read_glue_split(GLUE_TASKS["cola"], cola) == {
        "sentence": ["The sailors rode the breeze clear of the rocks .", "The more books I ask ."],
        "label": [1, 0],
    }
    mnli = tmp_path / "dev_matched.tsv"
    header = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "s1bp",
        "s2bp",
        "s1p",
        "s2p",
        "sentence1",
        "sentence2",
        "label1",
        "gold_label",
    ]
    rows = [
        ["0", "1", "1e", "fiction", "", "", "", "", "A man sleeps .", "A person rests .", "entailment", "entailment"],
        ["1", "2", "2c", "fiction", "", "", "", "", "A man sleeps .", "He runs .", "contradiction", "contradiction"],
    ]
    mnli.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    data = read_glue_split(GLUE_TASKS["mnli"], mnli)
    assert data["premise"] == ["A man sleeps .", "A man sleeps ."] and data["label"] == [0, 2]  # hub ids


@pytest.mark.parametrize(
    "task,folder,split,rows,positives",
    [
        ("mrpc", "MRPC", "train.tsv", 3668, 2474),
        ("mrpc", "MRPC", "dev.tsv", 408, 279),
        ("sst2", "SST-2", "dev.tsv", 872, 444),
    ],
)
def test_tsv_reader_on_the_real_files(shared_data, task, folder, split, rows, positives):
    data = read_glue_split(GLUE_TASKS[task], shared_data / "glue" / folder / split)
    assert len(data["label"]) == rows and sum(data["label"]) == positives  # SOURCES.md's counts
