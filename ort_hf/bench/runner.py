"""Runs the workers: one fresh process per (workload, variant, round), one at a time, variants
interleaved within each round and their order rotated between rounds, so a slow spell of the
machine does not land on one variant."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .sources import DataMissing, data_file, length_problem, model_config, model_problem
from .spec import VARIANTS, WORKLOADS, BenchSettings, applies
from .worker import settings_argv


def worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    # The same thread settings for every variant (the worker sizes ORT's pool to match).
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def plan(workloads: list[str], variants: list[str], rounds: int) -> list[tuple[int, str, str]]:
    """(round, workload, variant) in run order."""
    order = []
    for r in range(rounds):
        for w in workloads:
            usable = [v for v in variants if applies(VARIANTS[v], WORKLOADS[w])]
            shift = r % len(usable) if usable else 0
            order += [(r, w, v) for v in usable[shift:] + usable[:shift]]
    return order


def run_one(
    out: Path, r: int, workload: str, variant: str, settings: BenchSettings, timeout: float, resume: bool = False
) -> dict:
    name = f"{workload}--{variant}--r{r}"
    result_path, log_path = out / "runs" / f"{name}.json", out / "logs" / f"{name}.log"
    if resume and result_path.is_file():
        earlier = json.loads(result_path.read_text())
        if earlier.get("status") == "ok" and earlier.get("settings") == settings.as_dict():
            return {**earlier, "resumed": True}
    result_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "ort_hf.bench.worker",
        "--workload",
        workload,
        "--variant",
        variant,
        "--round",
        str(r),
        "--result",
        str(result_path),
        *settings_argv(settings),
    ]
    started, load = time.perf_counter(), os.getloadavg()[0]
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(settings.threads), timeout=timeout
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    if result_path.is_file():
        result = json.loads(result_path.read_text())
    else:
        reason = f"timed out after {timeout:.0f} s" if code is None else f"worker exited with code {code}"
        result = {
            "status": "failed",
            "reason": f"{reason}; see {log_path}",
            "workload": workload,
            "variant": variant,
            "round": r,
        }
    result["log"] = str(log_path)
    result["load_1min_at_start"] = load  # other processes' load skews a run: keep it with the result
    result.update(_ort_banner(log_path))
    result.setdefault("wall_s", time.perf_counter() - started)
    return result


# ORTModule's own account of its first step, printed once at log level WARNING and above.
_BANNER_RE = re.compile(r"Total ORT initialization overhead is ([\d.]+)s where export takes ([\d.]+)s")


def _ort_banner(log_path: Path) -> dict:
    match = _BANNER_RE.search(log_path.read_text(errors="replace"))
    if not match:
        return {}
    return {"ort_init_s": float(match.group(1)), "ort_banner_export_s": float(match.group(2))}


def run_all(
    workloads: list[str],
    variants: list[str],
    rounds: int,
    settings: BenchSettings,
    out: Path,
    timeout: float = 1800.0,
    echo=print,
    resume: bool = False,
) -> list[dict]:
    """Every planned run's result (skipped workloads as one ``status: skipped`` entry each)."""
    results, ready = [], []
    config = model_config(settings)
    for workload in workloads:
        try:
            problem = model_problem(WORKLOADS[workload], settings, config) or length_problem(
                WORKLOADS[workload], settings, config
            )
            if problem:
                raise DataMissing(problem)
            data_file(WORKLOADS[workload], settings)
            ready.append(workload)
        except DataMissing as exc:
            echo(f"ort-hf bench: skipping workload {workload}: {exc}")
            results.append(
                {"status": "skipped", "reason": str(exc), "workload": workload, "variant": None, "round": None}
            )
    order = plan(ready, variants, rounds)
    for i, (r, workload, variant) in enumerate(order, 1):
        result = run_one(out, r, workload, variant, settings, timeout, resume)
        results.append(result)
        echo(_progress(i, len(order), result))
    return results


def _progress(i: int, n: int, result: dict) -> str:
    head = f"[{i}/{n}] round {result['round'] + 1} {result['workload']} / {result['variant']}:"
    if result["status"] != "ok":
        return f"{head} {result['status'].upper()} ({result['reason']})"
    if result.get("resumed"):
        head += " (kept from an earlier, interrupted invocation)"
    return (
        f"{head} {result['samples_per_s']:.2f} samples/s, step median {1000 * result['step_median_s']:.0f} ms, "
        f"engine {result['engine']}, {result['wall_s']:.0f} s"
    )
