"""ORT's C++ extensions in ort_hf's cache: built once when two runs start together, and an
unusable cache dir means a warning and a temp dir, not a failed run."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ort_hf.engine import extensions

BUILD = "from ort_hf.engine.extensions import build_extension; build_extension('aten_op_executor'); print('loaded')"


def test_two_runs_starting_together_build_the_extension_once(tmp_path):
    env = {**os.environ, extensions.CACHE_ENV: str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0 and "loaded" in out, err[-3000:]
    builds = sum(err.count("building ORTModule extension aten_op_executor") for _, err in outputs)
    assert builds == 1  # the second run waited on the lock, then loaded the first one's build
    (built,) = Path(tmp_path).glob("extensions/*/aten_op_executor/build-*/aten_op_executor.so")
    assert built.stat().st_size > 0


def test_an_unwritable_cache_dir_falls_back_to_a_temp_dir_with_a_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # nothing can be created below a regular file (also as root)
    with pytest.warns(UserWarning, match=rf"{extensions.CACHE_ENV} to a writable directory"):
        chosen = extensions._writable_dir(blocker / "extensions" / "key")
    assert chosen.is_dir() and not str(chosen).startswith(str(blocker))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert extensions._writable_dir(tmp_path / "fine") == tmp_path / "fine"  # a usable dir: no warning
