"""A checkpoint whose save was interrupted is never picked for resume."""

import json

from datasets import Dataset
from tiny_models import FAMILIES, build
from transformers import TrainerCallback

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.checks import is_complete_checkpoint, last_complete_checkpoint


def test_half_written_checkpoints_are_skipped(tmp_path):
    for step, complete in ((10, True), (20, True), (30, False), (40, False)):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"x" * 10)
        if complete:
            (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-40" / "trainer_state.json").write_text('{"global_step": 4')  # killed mid-write
    assert not is_complete_checkpoint(tmp_path / "checkpoint-30")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")


def test_resume_true_uses_the_last_complete_checkpoint(tmp_path):
    data = Dataset.from_dict({"input_ids": [[5, 6, 7, 8]] * 16, "attention_mask": [[1] * 4] * 16, "labels": [1] * 16})

    def trainer(max_steps):
        args = ORTTrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, save_steps=2,
                                    per_device_train_batch_size=8, report_to=[], disable_tqdm=True,
                                    ort_fallback="disable", ort_log_level="ERROR")
        return ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=data)

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
