"""Results are kept per CPU kind: every result names its CPU (model, the instruction set PyTorch's
kernels use, cores), a run on another kind goes in a folder of its own beside the others, and
by-cpu.md shows every kind's ratios and targets side by side. The break-even point is the whole-run
arithmetic of ``ort_hf.whole_run``. No training here: the records are written from stored results."""

import json
import math

import torch

from ort_hf.bench.by_cpu import markdown_by_cpu, write_by_cpu
from ort_hf.bench.cpu import cpu_key, cpu_record, describe, make_record, record_of
from ort_hf.bench.render import markdown
from ort_hf.bench.summary import summarize
from ort_hf.whole_run import break_even_steps, whole_run_s


def _run(variant, samples_per_s, first_step_s, step_s, rnd=0):
    return {
        "status": "ok",
        "workload": "mlm",
        "variant": variant,
        "round": rnd,
        "engine": variant,
        "samples_per_s": samples_per_s,
        "tokens_per_s": 100.0,
        "step_times_s": [step_s] * 3,
        "first_step_s": first_step_s,
        "train_runtime_s": first_step_s + 3 * step_s,
        "final_step": 4,
        "final_loss": 7.0,
        "losses": [(4, 7.0)],
    }


def _report(record, ort_speed, first_step_s=5.0):
    rows = summarize([_run("eager", 4.0, 2.0, 1.0), _run("ort", 4.0 * ort_speed, first_step_s, 1.0 / ort_speed)])
    conditions = {
        "cpu": record,
        "command": "ort-hf bench",
        "date": "2026-11-26T00:00",
        "tree": "abc1234",
        "settings": "1 rounds, dropout model default",
    }
    return {"conditions": conditions, "rows": rows, "targets": [], "runs": []}


def test_this_machines_cpu_record_names_model_capability_and_cores():
    record = cpu_record()
    assert record["capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["cores"] >= 1 and record["model"]
    assert record["key"] == cpu_key(record["model"], record["capability"], record["cores"], record.get("family"))
    assert record["capability"].lower() in record["key"]
    if "family" in record:  # /proc/cpuinfo has one on every x86 Linux
        assert f"family{record['family']}" in record["key"] and f"(family {record['family']})" in describe(record)


def test_cpu_keys_tell_kinds_apart_and_old_results_are_read_from_their_machine_line():
    amd = cpu_key("AMD EPYC", "AVX2", 2)
    intel = cpu_key("Intel(R) Xeon(R) CPU @ 2.20GHz", "AVX512", 2)
    assert amd == "amd-epyc-avx2-2cpu" and intel == "intel-xeon-avx512-2cpu"
    # A VM that names two AMD generations "AMD EPYC" with the same vector width: the family tells them apart.
    zen4, zen5 = make_record("AMD EPYC", "AVX512", 2, 25), make_record("AMD EPYC", "AVX512", 2, 26)
    assert zen4["key"] == "amd-epyc-avx512-family25-2cpu" != zen5["key"]
    assert describe(zen4) == "AMD EPYC (family 25), AVX512, 2 cores"
    # A stored record keeps the key it was written under.
    assert record_of({"cpu": make_record("AMD EPYC", "AVX512", 2)})["key"] == "amd-epyc-avx512-2cpu"
    # What `ort-hf bench` recorded before it wrote a CPU record (docs/results' committed runs).
    old = {"machine": "2 CPUs (AMD EPYC; PyTorch's CPU kernels: AVX2), Linux 6.18.44-fc-v657"}
    assert record_of(old) == make_record("AMD EPYC", "AVX2", 2)
    assert record_of({"machine": "something else"}) is None


def test_rendering_two_cpu_kinds_keeps_both_with_their_own_targets(tmp_path):
    amd, intel = make_record("AMD EPYC", "AVX2", 2), make_record("Intel Xeon", "AVX512", 2)
    for record, speed in ((amd, 2.61), (intel, 1.79)):
        folder = tmp_path / record["key"]
        folder.mkdir()
        (folder / "bench.json").write_text(json.dumps(_report(record, speed)))
    path = write_by_cpu(tmp_path, {"speed": [{"workload": "mlm", "at_least": 2.0}]})
    text = path.read_text()
    assert "| workload | variant | AMD EPYC, AVX2, 2 cores | Intel Xeon, AVX512, 2 cores |" in text
    row = next(line for line in text.splitlines() if line.startswith("| mlm | ort |"))
    assert "2.61x" in row and "1.79x" in row
    # Each kind's targets are checked on its own results: met on one, not on the other.
    sections = text.split("## ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["AMD EPYC, AVX2, 2 cores", "Intel Xeon, AVX512, 2 cores"]
    assert "| yes |" in sections[0] and "| NO |" not in sections[0]
    assert "| NO |" in sections[1]
    # A third kind's run adds a column; the other two stay.
    arm = make_record("Neoverse-N1", "DEFAULT", 4)
    (tmp_path / arm["key"]).mkdir()
    (tmp_path / arm["key"] / "bench.json").write_text(json.dumps(_report(arm, 1.2)))
    text = write_by_cpu(tmp_path).read_text()
    assert (
        "| workload | variant | AMD EPYC, AVX2, 2 cores | Intel Xeon, AVX512, 2 cores | Neoverse-N1, DEFAULT, 4 cores |"
    ) in text
    row = next(line for line in text.splitlines() if line.startswith("| mlm | ort |"))
    assert "2.61x" in row and "1.79x" in row and "1.20x" in row
    assert markdown_by_cpu([(arm, _report(arm, 1.2))]).count(" cores |") == 1  # one kind, one column


def test_each_table_names_its_cpu():
    report = _report(make_record("AMD EPYC", "AVX2", 2), 2.0)
    assert "CPU: AMD EPYC, AVX2, 2 cores" in markdown(report["rows"], [], report["conditions"])
    # /proc/cpuinfo's model name, as an Intel Xeon VM gives it, without its marks and clock
    assert describe(make_record("Intel(R) Xeon(R) Processor @ 2.50GHz", "AVX512", 2)) == "Intel Xeon, AVX512, 2 cores"


def test_break_even_is_where_the_whole_runs_cross():
    # ORT: first step 5 s, then 0.5 s; eager: first step 2 s, then 1 s.
    steps = break_even_steps(5.0, 0.5, 2.0, 1.0)
    assert whole_run_s(5.0, 0.5, int(steps)) < whole_run_s(2.0, 1.0, int(steps))
    assert whole_run_s(5.0, 0.5, int(steps) - 1) >= whole_run_s(2.0, 1.0, int(steps) - 1)
    assert break_even_steps(1.0, 0.5, 2.0, 1.0) == 1  # cheaper from the first step
    assert math.isinf(break_even_steps(5.0, 1.2, 2.0, 1.0))  # no saving per step: never
    rows = summarize([_run("eager", 4.0, 2.0, 1.0), _run("ort", 8.0, 5.0, 0.5)])
    ort = next(r for r in rows if r["variant"] == "ort")
    assert ort["break_even_steps"] == steps
    assert "| mlm | ort |" in markdown(rows, [], {}) and f"| {steps:.0f} |" in markdown(rows, [], {})


def test_render_only_rewrites_by_cpu_from_the_folders_and_runs_nothing(tmp_path):
    import pytest

    from ort_hf.cli import main

    with pytest.raises(SystemExit, match="no results in"):
        main(["bench", "--out", str(tmp_path), "--render_only"])
    for record, speed in ((make_record("AMD EPYC", "AVX2", 2), 2.61), (make_record("Intel Xeon", "AVX512", 2), 1.79)):
        (tmp_path / record["key"]).mkdir()
        (tmp_path / record["key"] / "bench.json").write_text(json.dumps(_report(record, speed)))
    assert main(["bench", "--out", str(tmp_path), "--render_only"]) == 0
    text = (tmp_path / "by-cpu.md").read_text()
    assert "AMD EPYC, AVX2, 2 cores | Intel Xeon, AVX512, 2 cores |" in text
    assert not list(tmp_path.glob("*/runs"))  # nothing ran
