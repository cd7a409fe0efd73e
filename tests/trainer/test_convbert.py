"""ConvBERT through ORTTrainer and Trainer from the same seed: the same loss at every step, the
same weights at the end.

ConvBERT's span-based convolution starts with a depthwise Conv1d (groups = channels). ORT 1.19.2's
CPU gradient of a grouped 1-D convolution zeroed memory past its output, so other gradients came
out wrong, a step's loss could be non-finite, or malloc aborted, until engine/cpu_kernel_swaps.py
ran it as the 2-D kernel. The config is ConvBERT's own defaults (AutoConfig.for_model) shrunk, on
right-padded ragged batches as DataCollatorWithPadding makes them.
"""

from __future__ import annotations

import math

import torch
import transformers as tf
from datasets import Dataset
from tiny_models import pad_right, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

# A large step makes a wrong gradient show in the loss within the run.
VOCAB, ROWS, BATCH, STEPS, LR = 100, 64, 8, 8, 1.0


def _pad_rows(rows):
    return pad_right(rows, token_labels=False)


def _model():
    torch.manual_seed(0)
    config = tf.AutoConfig.for_model(
        "convbert",
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    return tf.ConvBertForSequenceClassification(config)


def _ragged(seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (ROWS,), generator=g).tolist()
    ids = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
    return Dataset.from_dict({"input_ids": ids, "labels": torch.randint(0, 2, (ROWS,), generator=g).tolist()})


def _train(tmp_path, ort: bool):
    args = dict(
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        optim="sgd",
        learning_rate=LR,
        lr_scheduler_type="constant",
        use_cpu=True,
    )
    if ort:
        # Padding elimination is no part of this: it is not exact for ConvBERT (its convolution reads
        # padding positions), and the bug was there with ort_hf's padding rewrites off.
        args = tiny_args(
            ORTTrainingArguments, tmp_path / "ort", ort_trim_padding=False, ort_eliminate_padding=False, **args
        )
        trainer = ORTTrainer(model=_model(), args=args, train_dataset=_ragged(), data_collator=_pad_rows)
    else:
        trainer = Trainer(
            model=_model(),
            args=tiny_args(TrainingArguments, tmp_path / "pt", **args),
            train_dataset=_ragged(),
            data_collator=_pad_rows,
        )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_convbert_losses_and_weights_match_trainer(tmp_path):
    _, ref, ref_params = _train(tmp_path, ort=False)
    trainer, got, params = _train(tmp_path, ort=True)
    assert trainer.ort_engine_status().backend == "ort"
    assert len(got) == len(ref) == STEPS
    # Trainer logs a non-finite step's loss as 0.0 (logging_nan_inf_filter): compare, don't trust finiteness.
    assert all(math.isfinite(x) and x > 0 for x in got)
    diffs = [abs(a - b) for a, b in zip(ref, got)]
    assert max(diffs) <= 1e-4, f"losses {ref} vs {got}: max diff {max(diffs):.2e} at step {diffs.index(max(diffs)) + 1}"
    for name, want in ref_params.items():  # the corruption showed in weights before it reached the loss
        torch.testing.assert_close(params[name], want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
