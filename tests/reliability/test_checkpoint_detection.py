"""A checkpoint whose save was interrupted, or whose files were damaged since, is never picked
for resume; naming one explicitly gets a message pointing at the newest intact one."""

import json

import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file
from tiny_models import FAMILIES, build
from transformers import TrainerCallback

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.checks import checkpoint_problem, is_complete_checkpoint, last_complete_checkpoint


def test_half_written_checkpoints_are_skipped(tmp_path):
    for step, complete in ((10, True), (20, True), (30, False), (40, False)):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        save_file({"w": torch.zeros(4)}, str(ckpt / "model.safetensors"))
        if complete:
            (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-40" / "trainer_state.json").write_text('{"global_step": 4')  # killed mid-write
    assert not is_complete_checkpoint(tmp_path / "checkpoint-30")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")


DATA = Dataset.from_dict({"input_ids": [[5, 6, 7, 8]] * 16, "attention_mask": [[1] * 4] * 16, "labels": [1] * 16})


def _trainer(out, max_steps):
    args = ORTTrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        save_steps=2,
        per_device_train_batch_size=8,
        report_to=[],
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    return ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=DATA)


def test_resume_true_uses_the_last_complete_checkpoint(tmp_path):
    def trainer(max_steps):
        return _trainer(tmp_path, max_steps)

    class CountSteps(TrainerCallback):
        steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            CountSteps.steps += 1

    trainer(4).train()
    broken = tmp_path / "checkpoint-6"  # a later save that died before its state file
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"partial")
    resumed = trainer(8)
    resumed.add_callback(CountSteps())
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 8
    assert CountSteps.steps == 4  # steps 5-8: continued from checkpoint-4, not the broken checkpoint-6


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    _trainer(out, 4).train()
    return out


@pytest.mark.parametrize(
    "damage", ["truncated model", "overwritten optimizer header", "truncated optimizer", "empty rng state"]
)
def test_damaged_checkpoint_files_are_found(two_checkpoints, tmp_path, damage):
    import shutil

    ckpt = tmp_path / "checkpoint-4"
    shutil.copytree(two_checkpoints / "checkpoint-4", ckpt)
    assert checkpoint_problem(ckpt) is None  # intact as the Trainer wrote it
    name = {
        "truncated model": "model.safetensors",
        "overwritten optimizer header": "optimizer.pt",
        "truncated optimizer": "optimizer.pt",
        "empty rng state": "rng_state.pth",
    }[damage]
    target = ckpt / name
    data = bytearray(target.read_bytes())
    if damage.startswith("truncated"):
        data = data[: len(data) // 2]
    elif damage == "overwritten optimizer header":
        import zipfile

        with zipfile.ZipFile(target) as archive:  # the last member's local header, found by the directory
            offset = archive.infolist()[-1].header_offset
        data[offset : offset + 64] = bytes(b ^ 0xFF for b in data[offset : offset + 64])
    else:
        data = bytearray(b"\0" * 16)
    target.write_bytes(bytes(data))
    problem = checkpoint_problem(ckpt)
    assert problem is not None and name in problem


def test_a_damaged_newest_checkpoint_is_skipped_and_named_when_asked_for(two_checkpoints, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    (out / "checkpoint-4" / "model.safetensors").write_bytes(b"overwritten")
    assert last_complete_checkpoint(out) == str(out / "checkpoint-2")
    with pytest.raises(
        ValueError, match=r"model.safetensors is damaged.*newest intact checkpoint next to it is .*checkpoint-2"
    ):
        _trainer(out, 6).train(resume_from_checkpoint=str(out / "checkpoint-4"))
    resumed = _trainer(out, 6)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6 and resumed.ort_engine_status().backend == "ort"


@pytest.mark.parametrize(
    "writer, existed, removed",
    [(True, False, True), (False, False, False), (True, True, False)],
    ids=["writer-own-folder", "other-rank", "folder-from-before"],
)
def test_only_the_writer_removes_an_unfinished_checkpoint_it_started(tmp_path, writer, existed, removed):
    from ort_hf.trainer.checks import CheckpointWriteError, unfinished_checkpoint_guard

    folder = tmp_path / "checkpoint-6"
    if existed:
        folder.mkdir()
    raised = CheckpointWriteError if removed else OSError
    with pytest.raises(raised):
        with unfinished_checkpoint_guard(str(tmp_path), lambda: 6, writes_checkpoints=writer):
            folder.mkdir(exist_ok=True)
            (folder / "model.safetensors").write_bytes(b"partial")  # no trainer_state.json: unfinished
            raise OSError(28, "No space left on device")
    assert folder.exists() is not removed
