"""Every head a fine-tuner trains, through ORTTrainer and Trainer from the same seed: the same
losses and weights, ORT proven to have run, and the loss placed where it belongs (ModuleWithLoss's
cross-entropy where it is the model's loss, the model's own loss otherwise)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from datasets import Dataset
from tiny_models import FAMILIES, VOCAB, _bert, _t5, build, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

ROWS, SEQ = 16, 12


def _ids(g, rows=ROWS, seq=SEQ):
    return torch.randint(3, VOCAB, (rows, seq), generator=g)


def _bert_head(cls, **config):
    def make():
        torch.manual_seed(0)
        cfg = _bert(tf.BertConfig)(0.0, "eager")
        for key, value in config.items():
            setattr(cfg, key, value)
        return cls(cfg)

    return make


def _bart():
    torch.manual_seed(0)
    return tf.BartForConditionalGeneration(
        tf.BartConfig(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
        )
    )


def _data(kind: str) -> Dataset:
    g = torch.Generator().manual_seed(0)
    ids = _ids(g)
    rows = {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()}
    if kind == "cls":
        rows["labels"] = (ids[:, 0] > 50).long().tolist()
    elif kind == "regression":
        rows["labels"] = (ids[:, 0].float() / VOCAB).tolist()
    elif kind == "token":
        rows["labels"] = (ids % 3).masked_fill(ids < 10, -100).tolist()
    elif kind == "qa":
        start = torch.randint(0, SEQ // 2, (ROWS,), generator=g)
        rows.update(start_positions=start.tolist(), end_positions=(start + 2).tolist())
    elif kind == "choice":
        choices = _ids(g, ROWS * 3).view(ROWS, 3, SEQ)
        rows = {
            "input_ids": choices.tolist(),
            "attention_mask": torch.ones_like(choices).tolist(),
            "labels": (choices[:, :, 0].argmax(-1)).tolist(),
        }
    elif kind == "mlm":
        chosen = torch.rand(ids.shape, generator=g) < 0.25
        chosen[:, 1] = True
        rows["labels"] = ids.masked_fill(~chosen, -100).tolist()
    elif kind == "clm":
        rows["labels"] = ids.masked_fill(torch.arange(SEQ) < SEQ // 3, -100).tolist()  # prompt masked
    elif kind == "s2s":
        rows["labels"] = _ids(g, ROWS, SEQ // 2).tolist()
    return Dataset.from_dict(rows)


def _t5_model():
    torch.manual_seed(0)
    return tf.T5ForConditionalGeneration(_t5(0.0, "eager"))


# head -> (model factory, data kind, loss ModuleWithLoss should compute)
HEADS = {
    "sequence-classification": (lambda: build(FAMILIES["bert-cls"]), "cls", "cross_entropy"),
    "regression": (_bert_head(tf.BertForSequenceClassification, num_labels=1), "regression", "model"),
    "token-classification": (_bert_head(tf.BertForTokenClassification, num_labels=3), "token", "cross_entropy"),
    "question-answering": (_bert_head(tf.BertForQuestionAnswering), "qa", "model"),
    "multiple-choice": (_bert_head(tf.BertForMultipleChoice), "choice", "cross_entropy"),
    "masked-lm": (lambda: build(FAMILIES["bert-mlm"]), "mlm", "cross_entropy"),
    "causal-lm": (lambda: build(FAMILIES["llama-clm"]), "clm", "cross_entropy"),
    "seq2seq-t5": (_t5_model, "s2s", "cross_entropy"),
    "seq2seq-bart": (_bart, "s2s", "cross_entropy"),
}


def _train(head: str, out, ort: bool):
    make_model, kind, _ = HEADS[head]
    model = make_model()
    model.train()
    # SGD: Adam would turn float noise in gradients that are zero in exact arithmetic (a QA head's
    # bias shifts every position's logit alike) into steps of lr.
    args = tiny_args(
        ORTTrainingArguments if ort else TrainingArguments,
        out,
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        optim="sgd",
    )
    trainer = (ORTTrainer if ort else Trainer)(model=model, args=args, train_dataset=_data(kind))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_head_trains_through_ort_as_with_trainer(head, tmp_path):
    _, ref_losses, ref_params = _train(head, tmp_path / "pt", ort=False)
    trainer, losses, params = _train(head, tmp_path / "ort", ort=True)
    assert trainer.ort_engine_status().backend == "ort", trainer.ort_engine_status()
    assert trainer._ort_run.loss_module.loss_kind == HEADS[head][2]
    assert len(losses) == len(ref_losses) == 4
    assert max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-4, (ref_losses, losses)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    initial = HEADS[head][0]().state_dict()
    assert any(not torch.equal(params[n], initial[n]) for n in params), "training changed nothing"
