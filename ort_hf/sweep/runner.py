"""Runs sweep cases in worker processes and turns what they report into cells.

Each stage of a case (Trainer's run, then each mode) gets ``timeout`` seconds from its start. A stage
that overruns is stopped (the worker's process group is killed), one whose process dies is noted
as such, and either way the case goes on: a new worker takes the remaining modes, loading Trainer's
run from the shared state folder instead of repeating it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .cases import SETTINGS
from .cells import classify

POLL_S = 0.25
REFERENCE = "reference"


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # One thread each (two workers on two cores); nothing may come from the Hugging Face hub.
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    # The worker imports the ort_hf this runner is (a checkout on PYTHONPATH, or the installed one).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


# What every worker imports: a forked worker (the default) starts with them loaded instead of
# spending most of a tiny case importing them again (on two busy cores, longer than the case's work).
_PRELOAD = ("torch", "transformers", "datasets", "tokenizers", "ort_hf.trainer", "ort_hf.sweep.worker")


def preload() -> None:
    """Import what workers need, in this process, before it forks any (``fork=True``)."""
    import importlib

    os.environ.update({k: v for k, v in worker_env().items() if k != "PYTHONPATH"})
    for name in _PRELOAD:
        importlib.import_module(name)
    from transformers import Trainer  # noqa: F401  (transformers imports it lazily)

    from ..engine import ensure_engine

    ensure_engine()


class _Forked:
    """A worker forked from this process (already holding the imports): the part of ``Popen`` the
    runner uses."""

    def __init__(self, argv: list[str], log):
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode = None
        self.pid = os.fork()
        if self.pid == 0:  # the worker
            code = 1
            try:
                os.setsid()  # its own group: a kill takes ORT's threads too
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                from .worker import main

                code = main(argv)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class _Attempt:
    """One worker process and what it reported: stages finished, the stage running, its steps."""

    def __init__(self, task: str, model_type: str, modes: list[str], state: Path, attempt: int, log, fork: bool):
        self.events_path = state / f"events-{attempt}.jsonl"
        self.events_path.touch()
        argv = [
            "--task",
            task,
            "--type",
            model_type,
            "--modes",
            ",".join(modes),
            "--state",
            str(state),
            "--attempt",
            str(attempt),
        ]
        cmd = [sys.executable, "-m", "ort_hf.sweep.worker", *argv]
        log.write(f"$ {' '.join(cmd)}{' (forked)' if fork else ''}\n")
        log.flush()
        if fork:
            self.proc = _Forked(argv, log)
        else:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(), start_new_session=True
            )  # its own group: a kill takes ORT's threads too
        self.offset = 0
        self.done: dict[str, dict] = {}
        self.stage, self.stage_started, self.losses = REFERENCE, time.monotonic(), []

    def read_events(self) -> None:
        with open(self.events_path) as f:
            f.seek(self.offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break  # a line still being written: read it next time
                self.offset = f.tell()
                self._note(json.loads(line))

    def _note(self, event: dict) -> None:
        if event["event"] == "start":
            self.stage, self.stage_started, self.losses = event["stage"], time.monotonic(), []
        elif event["event"] == "step":
            self.losses.append(event["loss"])
        elif event["event"] == "done":
            self.done[event["stage"]] = event["record"]

    def watch(self, timeout: float) -> str | None:
        """Wait for the worker to end; ``"timeout"`` if a stage overran (then it is killed),
        ``"died"`` if it ended with a stage unfinished, None if every stage it began finished."""
        while True:
            self.read_events()
            if self.proc.poll() is not None:
                self.read_events()
                return None if self.stage in self.done else "died"
            if time.monotonic() - self.stage_started > timeout:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                self.read_events()
                return None if self.stage in self.done else "timeout"
            time.sleep(POLL_S)


def run_case(task: str, model_type: str, modes: list[str], timeout: float, log_path: Path, fork: bool = False) -> dict:
    """One case: ``{"task", "model_type", "model_class", "params", "reference", "modes": {mode: cell
    and facts}, "wall_s"}``."""
    started = time.perf_counter()
    state = Path(tempfile.mkdtemp(prefix="ort-hf-sweep-state-"))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    reference, runs, attempt = None, {}, 0
    try:
        with open(log_path, "w") as log:
            while True:
                remaining = [m for m in modes if m not in runs]
                current = _Attempt(task, model_type, remaining, state, attempt, log, fork)
                ended = current.watch(timeout)
                reference = reference or current.done.get(REFERENCE)
                runs.update({m: r for m, r in current.done.items() if m != REFERENCE})
                if ended is None:
                    break
                detail = _killed_detail(ended, timeout, current, log_path)
                if reference is None:
                    reference = {"status": "not-counted", "reason": f"Trainer's run: {detail}"}
                    break
                # A restarted worker that ended before its first mode began takes that mode down with it.
                stage = remaining[0] if current.stage == REFERENCE else current.stage
                steps = current.losses if stage == current.stage else []
                runs[stage] = {"killed": ended, "detail": detail, "steps_done": len(steps), "losses": steps}
                if not [m for m in modes if m not in runs]:
                    break
                attempt += 1
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return _case_record(
        task,
        model_type,
        modes,
        reference or {"status": "not-counted", "reason": "no result"},
        runs,
        time.perf_counter() - started,
    )


def _killed_detail(ended: str, timeout: float, attempt: _Attempt, log_path: Path) -> str:
    if ended == "timeout":
        return f"stopped after {timeout:.0f} s"
    code = attempt.proc.returncode
    reason = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return f"the worker process died ({reason}; log {log_path})"


def _case_record(task: str, model_type: str, modes: list[str], reference: dict, runs: dict, wall_s: float) -> dict:
    results = {}
    for mode in modes:
        run = runs.get(mode, {"killed": "died", "detail": "not reached", "steps_done": 0, "losses": []})
        verdict = classify(reference, run)
        results[mode] = {
            **verdict,
            "trainer_losses": reference.get("losses"),
            "ort_losses": run.get("losses"),
            "error": run.get("error"),
            **{
                k: run.get(k)
                for k in (
                    "backend",
                    "export_s",
                    "swapped",
                    "padding",
                    "chunked_lm_loss",
                    "wall_s",
                    "grad_rel_error",
                    "worst_param",
                    "worst_param_rel_error",
                )
            },
        }
    return {
        "task": task,
        "model_type": model_type,
        "model_class": reference.get("model_class"),
        "params": reference.get("params"),
        "attn_implementation": reference.get("attn_implementation"),
        "reference": {k: reference.get(k) for k in ("status", "reason", "losses", "fp32_grad_floor", "wall_s")},
        "modes": results,
        "wall_s": round(wall_s, 1),
        "settings": {
            "steps": SETTINGS.steps,
            "batch_size": SETTINGS.batch_size,
            "seed": SETTINGS.seed,
            "learning_rate": SETTINGS.learning_rate,
        },
    }
