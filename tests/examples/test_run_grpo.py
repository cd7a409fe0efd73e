"""examples/run_grpo end to end: LoRA GRPO through ORT on SST-2 prompts, then the same run in plain
GRPOTrainer and the side-by-side timings ``--compare`` prints; the README's table is the committed runs."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "examples" / "run_grpo"
pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")


def _argv(out: Path, sst2: Path) -> list[str]:
    return [
        "--output_dir",
        str(out),
        "--train_file",
        str(sst2 / "train.tsv"),
        "--max_train_samples",
        "8",
        "--tiny_hidden_size",
        "32",
        "--tiny_layers",
        "1",
        "--lora_r",
        "4",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--max_completion_length",
        "4",
        "--warmup_steps_excluded",
        "1",
        "--seed",
        "0",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
        "--gradient_checkpointing",
        "false",
        "--ort_fallback",
        "disable",
    ]


def test_run_grpo_trains_through_ort_and_compares(shared_data, tmp_path, monkeypatch, capfd):
    monkeypatch.syspath_prepend(str(FOLDER))
    import run_grpo

    argv = _argv(tmp_path, shared_data / "glue" / "SST-2")
    # --compare runs the script once per engine in a fresh process (run_compare, tested with run_glue
    # and run_mlm); here the two runs are made in this process, in the folders run_compare gives them.
    runs = {}
    for name, use_ort in (("ort", "true"), ("pytorch", "false")):
        run_argv = [*argv, "--use_ort", use_ort]
        run_argv[run_argv.index("--output_dir") + 1] = str(tmp_path / name)
        assert run_grpo.main(run_argv) == 0
        runs[name] = json.loads((tmp_path / name / "ort_hf_summary.json").read_text())
    ort, pt = runs["ort"], runs["pytorch"]
    assert ort["engine"] == "ort" and ort["head_on_used_rows"] is True  # fallback disabled: ORT trained
    assert pt["engine"] == "pytorch" and pt["head_on_used_rows"] is None
    for summary in runs.values():
        assert summary["timed_steps"] == 1 and summary["steps"] == 2
        assert 0 < summary["generation_s"] < summary["step_s"] and summary["generation_cpu_s"] > 0
        assert summary["train_part_s"] == pytest.approx(summary["step_s"] - summary["generation_s"])
    # The same seed samples the same completions from the same initial weights: the first rewards agree.
    assert ort["reward_first"] == pytest.approx(pt["reward_first"], abs=1e-4)
    capfd.readouterr()
    run_grpo.compare_timings(str(tmp_path))
    printed = capfd.readouterr().out
    for key in ("train_part_s", "generation_s", "generation_cpu_s", "step_s", "peak_memory_mb"):
        ratio = ort[key] / pt[key]
        assert re.search(rf"{key} .* {ratio:.2f}x", printed), (key, printed)
    sys.modules.pop("run_grpo", None)


def test_readme_table_is_the_committed_results():
    """Every figure in run_grpo's measured table comes from results/*.json (no hand-copied numbers)."""
    ort = json.loads((FOLDER / "results" / "ort.json").read_text())
    pt = json.loads((FOLDER / "results" / "pytorch.json").read_text())
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
        for line in (FOLDER / "README.md").read_text().splitlines()
        if re.match(r"\| (training|generation|whole|peak)", line)
    }
    for key, row in (
        ("train_part_s", "training part, s"),
        ("generation_s", "generation part, s"),
        ("step_s", "whole step, s"),
        ("peak_memory_mb", "peak memory MB (per step)"),
    ):
        ours, theirs, ratio = rows[row]
        assert f"{ort[key]:.4g}" == ours, row
        assert f"{pt[key]:.4g}" == theirs, row
        assert f"{ort[key] / pt[key]:.2f}x" == ratio, row
