"""A full disk (a real ENOSPC from a small tmpfs) or a read-only one (a tmpfs mounted ro, which
binds root too): the caches fall back with a warning, and a checkpoint that cannot be written
ends the run with a message naming the intact checkpoint, from which the run resumes with the
uninterrupted losses."""

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from tiny_models import FAMILIES, build, id_dataset

from ort_hf.engine import extensions
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.checks import CheckpointWriteError, is_complete_checkpoint

CACHE_RUN = Path(__file__).with_name("cache_run.py")


@pytest.fixture
def small_disk(tmp_path):
    """mount(size_kb) -> a tmpfs folder of that size; remount(size_kb) grows it."""
    mounted = []

    def mount(size_kb: int, read_only: bool = False) -> Path:
        if shutil.which("mount") is None or shutil.which("umount") is None:
            pytest.skip("a full disk is simulated with a small tmpfs, and mount/umount are not installed here")
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        options = f"size={size_kb}k" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(
                f"a full disk is simulated with a small tmpfs, and mounting one needs root / "
                f"CAP_SYS_ADMIN here: {done.stderr.strip()}"
            )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _fill(folder: Path) -> None:
    try:
        with open(folder / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC: the disk is full now


def _train_with_export_cache(cache_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, str(CACHE_RUN), str(cache_dir), "eager"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["backend"] == "ort" and len(result["losses"]) == 3
    return result


def _assert_extension_dir_falls_back(disk: Path, reason: str) -> None:
    with pytest.warns(UserWarning, match=reason):
        chosen = extensions._writable_dir(disk / "extensions" / "key")
    assert chosen.is_dir() and not str(chosen).startswith(str(disk))


def test_a_full_export_cache_disk_warns_and_trains(small_disk):
    disk = small_disk(64)
    _fill(disk)
    result = _train_with_export_cache(disk / "cache")
    assert result["export_count"] == 2  # the export whose save hit the full disk, then one without the cache
    assert any("No space left on device" in w and "without the cache" in w for w in result["warnings"]), result


def test_a_full_extension_cache_disk_falls_back_to_a_temp_dir(small_disk):
    disk = small_disk(64)
    _fill(disk)
    _assert_extension_dir_falls_back(disk, "No space left on device")


def test_read_only_cache_disks_warn_and_train(small_disk):
    disk = small_disk(64, read_only=True)
    _assert_extension_dir_falls_back(disk, "Read-only file system")
    result = _train_with_export_cache(disk / "cache")
    assert result["export_count"] == 1
    assert any("cannot be used" in w and "Read-only file system" in w for w in result["warnings"]), result


def test_a_read_only_output_dir_is_refused_before_training(small_disk):
    disk = small_disk(64, read_only=True)
    trainer = _trainer(disk)  # an existing folder: the Trainer's own makedirs passes, the first save would fail
    with pytest.raises(ValueError, match=r"--output_dir .* is not writable \(Read-only file system\)"):
        trainer.train()
    assert trainer.state.global_step == 0 and trainer.ort_engine_status() is None  # nothing ran


def _dataset():
    return id_dataset(48, 16, lambda ids, g: ids[:, 0] % 2, attention_mask=False)


def _trainer(out: Path, **kw) -> ORTTrainer:
    args = ORTTrainingArguments(
        output_dir=str(out),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        report_to=[],
        save_strategy="steps",
        save_steps=2,
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
        **kw,
    )
    return ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=_dataset())


def _losses(trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def test_a_checkpoint_that_fills_the_disk_keeps_the_last_one_and_resumes(small_disk, tmp_path):
    reference = _trainer(tmp_path / "uninterrupted")
    reference.train()
    one_checkpoint_kb = int(
        subprocess.run(
            ["du", "-sk", str(tmp_path / "uninterrupted" / "checkpoint-2")], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    disk = small_disk(int(one_checkpoint_kb * 1.6))  # room for checkpoint-2, not for checkpoint-4 beside it

    with pytest.raises(CheckpointWriteError) as raised:
        _trainer(disk).train()
    message = str(raised.value)
    assert "checkpoint-4" in message and f"{disk / 'checkpoint-2'}, is intact" in message
    assert "the disk is full" in message and "resume_from_checkpoint=True" in message
    assert is_complete_checkpoint(disk / "checkpoint-2") and not (disk / "checkpoint-4").exists()

    subprocess.run(["mount", "-o", f"remount,size={one_checkpoint_kb * 4}k", str(disk)], check=True)  # space freed
    resumed = _trainer(disk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.train(resume_from_checkpoint=True)
    expected, got = _losses(reference), _losses(resumed)
    assert sorted(got) == sorted(expected) == list(range(1, 7))
    assert max(abs(expected[s] - got[s]) for s in expected) <= 1e-5
    assert resumed.ort_engine_status().backend == "ort"
