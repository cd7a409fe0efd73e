"""With the density and memory callbacks off and --ort_log_facts false, an ORTTrainer run logs exactly
the keys a plain Trainer run logs (ORT proven to have trained); with the facts on, it adds ort/* keys."""

import pytest
import torch
from datasets import Dataset
from tiny_models import FAMILIES, build, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

OFF = dict(ort_density_callback=False, ort_memory_callback=False)


def _padded_dataset(n=16):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (n, 12), generator=gen)
    mask = (torch.arange(12)[None, :] < torch.randint(4, 13, (n,), generator=gen)[:, None]).long()
    return Dataset.from_dict(
        {
            "input_ids": (ids * mask).tolist(),
            "attention_mask": mask.tolist(),
            "labels": (ids[:, 0] > 50).long().tolist(),
        }
    )


def _log_keys(trainer_cls, args) -> list[list[str]]:
    trainer = trainer_cls(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=_padded_dataset())
    trainer.train()
    if trainer_cls is ORTTrainer:
        assert trainer.ort_engine_status().backend == "ort" and args.ort_fallback == "disable"
    return [sorted(entry) for entry in trainer.state.log_history]


@pytest.mark.parametrize("log_facts", [False, True])
def test_with_the_callbacks_off_the_logs_are_trainers(tmp_path, log_facts):
    common = dict(max_steps=2, per_device_train_batch_size=8, learning_rate=1e-3)
    plain = _log_keys(Trainer, tiny_args(TrainingArguments, tmp_path / "plain", **common))
    ours = _log_keys(
        ORTTrainer, tiny_args(ORTTrainingArguments, tmp_path / "ort", ort_log_facts=log_facts, **OFF, **common)
    )
    if log_facts:  # the facts are what differs
        assert "ort/export_s" in ours[0] and [k for k in ours[0] if not k.startswith("ort/")] == plain[0]
    else:
        assert ours == plain
