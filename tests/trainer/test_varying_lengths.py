"""ORTTrainer on batches of different lengths, through the one graph exported on the first batch.

DeBERTa (v1) and JetMoE once had a size of the first batch baked into that graph (ORT's chunk
symbolic; JetMoE's expert counts read out with .tolist()), and JetMoE's expert merge (index_add
with repeated indices) was exported wrong: a longer batch crashed at step 2, and JetMoE's losses
were off from step 1. Set up as the architecture sweep runs them: the type's own tiny config,
ragged rows right-padded per batch by DataCollatorWithPadding, dropout 0, SGD, same seed.
"""

import random

import pytest
import torch
from datasets import Dataset
from tiny_models import tiny_args
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, Trainer, TrainingArguments

from ort_hf.sweep.data import build_tokenizer
from ort_hf.sweep.tiny_config import tiny_config
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

STEPS, BATCH = 4, 4


def _rows(specials, n: int = STEPS * BATCH) -> Dataset:
    rng = random.Random(1)  # batches of 18, 23, 16 and 21 positions: longer and shorter than the first
    ordinary = specials.ordinary()
    lengths = [rng.randint(3, 24) for _ in range(n)]
    return Dataset.from_dict(
        {
            "input_ids": [[rng.choice(ordinary) for _ in range(k)] for k in lengths],
            "labels": [rng.randrange(2) for _ in range(n)],
        }
    )


class _Lengths:
    """The collator, noting each batch's padded length."""

    def __init__(self, collator):
        self.collator, self.seen = collator, []

    def __call__(self, rows):
        batch = self.collator(rows)
        self.seen.append(batch["input_ids"].shape[1])
        return batch


def _train(model_type: str, out, ort: bool):
    config, specials = tiny_config(model_type, num_labels=2)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    collator = _Lengths(DataCollatorWithPadding(build_tokenizer(specials)))
    common = dict(max_steps=STEPS, per_device_train_batch_size=BATCH, optim="sgd", learning_rate=0.05, use_cpu=True)
    if ort:
        # The pre-flight compares ORT with PyTorch on the first batch; every step is compared here.
        args = tiny_args(ORTTrainingArguments, out, ort_preflight="never", **common)
        trainer = ORTTrainer(model=model, args=args, train_dataset=_rows(specials), data_collator=collator)
    else:
        args = tiny_args(TrainingArguments, out, **common)
        trainer = Trainer(model=model, args=args, train_dataset=_rows(specials), data_collator=collator)
    trainer.train()
    return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h], collator.seen


@pytest.mark.parametrize("model_type", ["deberta", "jetmoe"])
def test_later_batches_of_other_lengths_match_trainer(model_type, tmp_path):
    _, expected, lengths = _train(model_type, tmp_path / "pt", ort=False)
    trainer, losses, ort_lengths = _train(model_type, tmp_path / "ort", ort=True)
    # the same batches; later ones both longer and shorter than the one the graph was exported on
    assert ort_lengths == lengths and min(lengths[1:]) < lengths[0] < max(lengths[1:]), lengths
    assert trainer.ort_engine_status().backend == "ort"
    assert trainer.ort_engine_status().export_count == 1  # one graph served every length
    assert len(losses) == len(expected) == STEPS
    diffs = [abs(a - b) for a, b in zip(expected, losses)]
    assert max(diffs) <= 1e-4, f"per-step loss diffs {diffs}"
