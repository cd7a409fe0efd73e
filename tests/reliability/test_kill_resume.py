"""SIGKILL at random points (including during checkpoint writes): the run resumes from the last
complete checkpoint and its losses match an uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STEPS = 40


def _start(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(HERE / "kill_run.py"), str(out), str(STEPS)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _losses(out: Path) -> dict[int, float]:
    return {int(k): v for k, v in json.loads((out / "losses.json").read_text()).items()}


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    full = tmp_path / "full"
    proc = _start(full)
    assert proc.wait(timeout=900) == 0, proc.stderr.read()[-2000:]
    reference = _losses(full)

    run = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    for _ in range(3):
        proc = _start(run)
        # wait for a new checkpoint to appear, then kill at a random moment (often mid-save)
        deadline = time.time() + 600
        before = set(os.listdir(run)) if run.exists() else set()
        while time.time() < deadline and proc.poll() is None:
            now = set(os.listdir(run)) if run.exists() else set()
            if any(n.startswith("checkpoint-") for n in now - before):
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
    assert kills >= 1
    proc = _start(run)
    assert proc.wait(timeout=900) == 0, proc.stderr.read()[-2000:]
    resumed = _losses(run)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert abs(resumed[step] - reference[step]) <= 1e-5, (step, resumed[step], reference[step])
