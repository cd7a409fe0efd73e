"""ORTSeq2SeqTrainer: Seq2SeqTrainer's recipe (T5), training through ORT, generating in PyTorch."""

import numpy as np
import torch
import transformers as tf
from tiny_models import _t5, id_dataset, tiny_args
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from ort_hf.trainer import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments


def _data(rows=16, seq=10):
    return id_dataset(rows, seq, lambda ids, g: ids[:, :4])  # "summarise": copy the first 4 tokens


def token_match(eval_pred):
    preds, labels = eval_pred
    n = min(preds.shape[1], labels.shape[1])
    used = labels[:, :n] != -100
    return {"token_match": float((preds[:, :n] == labels[:, :n])[used].mean())}


def _run(cls_trainer, cls_args, out):
    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(_t5(0.0, "eager"))
    args = tiny_args(
        cls_args,
        out,
        max_steps=4,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=0.05,
        optim="sgd",
        predict_with_generate=True,
        generation_max_length=6,
    )
    trainer = cls_trainer(
        model=model, args=args, train_dataset=_data(), eval_dataset=_data(8), compute_metrics=token_match
    )
    trainer.train()
    return trainer, trainer.evaluate()


def test_seq2seq_trains_through_ort_and_generates_like_seq2seq_trainer(tmp_path):
    ref, ref_metrics = _run(Seq2SeqTrainer, Seq2SeqTrainingArguments, tmp_path / "pt")
    ort, metrics = _run(ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments, tmp_path / "ort")
    assert ort.ort_engine_status().backend == "ort"
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (ref, ort)]
    np.testing.assert_allclose(losses[1], losses[0], atol=1e-4, rtol=0)
    assert metrics["eval_token_match"] == ref_metrics["eval_token_match"]
    assert abs(metrics["eval_loss"] - ref_metrics["eval_loss"]) <= 1e-4
