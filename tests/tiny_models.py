"""The tests' tiny things: transformers configs built in code (one per supported family), batches
and random-id datasets for them, and the Trainer arguments of a tiny run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as tf

VOCAB = 100
SEQ = 16
BATCH = 4


@dataclass(frozen=True)
class Family:
    name: str
    model_cls: type
    make_config: Callable[[float, str], object]  # (dropout, attn_implementation) -> config
    task: str  # "cls", "mlm" or "clm"
    sdpa: bool = True


def _bert(cfg_cls):
    def make(dropout: float, attn: str):
        return cfg_cls(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
            num_labels=2,
            pad_token_id=0,
            attn_implementation=attn,
        )

    return make


def _distilbert(dropout: float, attn: str):
    return tf.DistilBertConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=64,
        dropout=dropout,
        attention_dropout=dropout,
        seq_classif_dropout=dropout,
        num_labels=2,
        pad_token_id=0,
        attn_implementation=attn,
    )


def _deberta(dropout: float, attn: str):
    return tf.DebertaV2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        num_labels=2,
        pad_token_id=0,
        attn_implementation=attn,
    )


def _gpt2(dropout: float, attn: str):
    return tf.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        pad_token_id=0,
        attn_implementation=attn,
    )


def _llama(dropout: float, attn: str):
    return tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=dropout,
        pad_token_id=0,
        attn_implementation=attn,
    )


def _qwen2(dropout: float, attn: str):
    return tf.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=dropout,
        pad_token_id=0,
        attn_implementation=attn,
    )


def _modernbert(dropout: float, attn: str):
    return tf.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        attention_dropout=dropout,
        embedding_dropout=dropout,
        mlp_dropout=dropout,
        pad_token_id=0,
        local_attention=4,
        global_attn_every_n_layers=2,
        attn_implementation=attn,
    )


def _t5(dropout: float, attn: str):
    return tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        dropout_rate=dropout,
        use_cache=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        attn_implementation=attn,
    )


# Families that each needed something beyond the core symbolics (GQA, layer_norm without bias,
# Where with broadcasting in T5's SDPA path).
EXTRA_FAMILIES = {
    f.name: f
    for f in (
        Family("qwen2-clm", tf.Qwen2ForCausalLM, _qwen2, "clm"),
        Family("modernbert-mlm", tf.ModernBertForMaskedLM, _modernbert, "mlm"),
        Family("t5-s2s", tf.T5ForConditionalGeneration, _t5, "s2s"),
    )
}

FAMILIES = {
    f.name: f
    for f in (
        Family("bert-cls", tf.BertForSequenceClassification, _bert(tf.BertConfig), "cls"),
        Family("bert-mlm", tf.BertForMaskedLM, _bert(tf.BertConfig), "mlm"),
        Family("roberta-mlm", tf.RobertaForMaskedLM, _bert(tf.RobertaConfig), "mlm"),
        Family("distilbert-cls", tf.DistilBertForSequenceClassification, _distilbert, "cls"),
        Family("deberta-v2-cls", tf.DebertaV2ForSequenceClassification, _deberta, "cls", sdpa=False),
        Family("gpt2-clm", tf.GPT2LMHeadModel, _gpt2, "clm"),
        Family("llama-clm", tf.LlamaForCausalLM, _llama, "clm"),
    )
}


def build(family: Family, seed: int = 0, dropout: float = 0.0, attn: str = "eager"):
    """The family's tiny model, in train mode, from ``seed``."""
    torch.manual_seed(seed)
    model = family.model_cls(family.make_config(dropout, attn))
    model.train()
    return model


def make_batch(task: str, generator: torch.Generator, padded: bool = True) -> dict[str, torch.Tensor]:
    """Random tokens (ids >= 3 so none is the pad id), right padding on some rows, labels for the task."""
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
    mask = torch.ones_like(ids)
    if padded:
        for row, length in enumerate((SEQ, SEQ - 3, SEQ - 7, SEQ)):
            mask[row, length:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    batch = {"input_ids": ids, "attention_mask": mask}
    if task == "cls":
        batch["labels"] = torch.randint(0, 2, (BATCH,), generator=generator)
    elif task == "mlm":
        chosen = (torch.rand(ids.shape, generator=generator) < 0.3) & (mask == 1)
        chosen[:, 1] = True  # at least one label per row
        batch["labels"] = ids.masked_fill(~chosen, -100)
    elif task == "s2s":
        batch["labels"] = torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=generator)
    else:
        batch["labels"] = ids.masked_fill(mask == 0, -100)
    return batch


def ragged_batch(lengths, task: str, generator: torch.Generator, pad_left: bool = False) -> dict[str, torch.Tensor]:
    """Rows of SEQ positions with ``lengths`` real tokens each (padding on the right, or on the left),
    padding id 0, and labels for ``task``: -100 on the padding for token tasks, a class for "cls"."""
    ids = torch.randint(3, VOCAB, (len(lengths), SEQ), generator=generator)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        if pad_left:
            mask[row, SEQ - n :] = 1
        else:
            mask[row, :n] = 1
    ids = ids * mask
    labels = (
        ids.masked_fill(mask == 0, -100) if task != "cls" else torch.randint(0, 2, (len(lengths),), generator=generator)
    )
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def rule_labels(ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Sequence-classification labels a model can learn: first token above 50."""
    return (ids[:, 0] > 50).long()


def id_dataset(
    rows: int = 48,
    seq: int = SEQ,
    labels=rule_labels,
    *,
    seed: int = 0,
    low: int = 3,
    high: int = VOCAB,
    attention_mask: bool = True,
):
    """A ``Dataset`` of ``rows`` unpadded rows of ``seq`` random token ids in [low, high) (3 and up: none
    is the pad id) drawn from ``seed``, labelled by ``labels(ids, generator)`` (the same generator, after
    the ids); an all-ones ``attention_mask`` column unless ``attention_mask=False``."""
    from datasets import Dataset

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, high, (rows, seq), generator=gen)
    columns = {"input_ids": ids.tolist()}
    if attention_mask:
        columns["attention_mask"] = torch.ones_like(ids).tolist()
    columns["labels"] = labels(ids, gen).tolist()
    return Dataset.from_dict(columns)


def rule_dataset(n: int = 48, seed: int = 0):
    """Sequence classification on ``n`` rows whose label is a learnable rule (:func:`rule_labels`)."""
    return id_dataset(n, seed=seed)


# A tiny run's arguments that change nothing it computes: no reports, checkpoints or progress bar.
QUIET_RUN = dict(report_to=[], save_strategy="no", disable_tqdm=True)
# Through ORT, a test never measures PyTorch while believing it measures ORT: a failure raises.
STRICT_ORT = dict(ort_fallback="disable", ort_log_level="ERROR")


def tiny_args(args_cls, output_dir, **overrides):
    """``args_cls`` (``TrainingArguments``, ``ORTTrainingArguments``, ...) for a tiny test run: quiet
    (:data:`QUIET_RUN`), seed 0, a log line per step, and ORT strict (:data:`STRICT_ORT`) for an ORT
    arguments class; ``overrides`` win."""
    from ort_hf.trainer import ORTTrainingArguments

    strict = STRICT_ORT if issubclass(args_cls, ORTTrainingArguments) else {}
    return args_cls(output_dir=str(output_dir), **{**QUIET_RUN, "seed": 0, "logging_steps": 1, **strict, **overrides})


def pad_right(rows: list[dict], token_labels: bool = True) -> dict:
    """What DataCollatorWithPadding gives (each batch padded on the right with id 0 to its longest
    row), with labels: the ids, -100 on the padding (``token_labels``), or each row's ``labels``."""
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100) if token_labels else torch.tensor([r["labels"] for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
