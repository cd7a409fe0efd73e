"""The sweep's data: random rows of varied length, a tokenizer built in code over the tiny vocabulary,
and transformers' own collators, so that each batch is ragged and right-padded as users' are."""

from __future__ import annotations

import hashlib
import random

from .cases import RunSettings, Task
from .tiny_config import SpecialIds

# Special tokens the tokenizer names, when the config gives them an id (tokenizers' attribute names).
TOKENIZER_SPECIALS = ("pad", "mask", "bos", "eos", "unk", "sep", "cls")


def build_tokenizer(specials: SpecialIds):
    """A ``PreTrainedTokenizerFast`` over a WordLevel vocabulary of exactly ``vocab_size`` tokens,
    its special tokens at the config's ids: the collators pad and mask with the model's own ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names: dict[int, str] = {}
    for name, i in specials.by_name.items():
        names.setdefault(i, f"<{name}>")  # the first name an id has (gpt2's bos is its eos)
    vocab = {names.get(i, f"t{i}"): i for i in range(specials.vocab_size)}
    unk = names[specials.by_name["unk"]] if "unk" in specials.by_name else names[specials.by_name["pad"]]
    backend = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokens = {f"{k}_token": names[specials.by_name[k]] for k in TOKENIZER_SPECIALS if k in specials.by_name}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_input_names=["input_ids", "attention_mask"], padding_side="right", **tokens
    )
    if len(tokenizer) != specials.vocab_size:  # a special token added past the vocabulary would be out of range
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, the config's vocabulary {specials.vocab_size}")
    return tokenizer


def build_rows(task: Task, specials: SpecialIds, settings: RunSettings) -> list[dict]:
    """``steps x batch_size`` rows of seeded random ids that no special token uses, ``min_len`` to
    ``max_len`` long; a packed task's rows share one length per batch, from ``packed_min_len`` (the
    trainers take the rows in order)."""
    rng = random.Random(settings.seed)
    ordinary = specials.ordinary()
    num_labels = task.num_labels or 2
    rows = []
    for i in range(settings.steps * settings.batch_size):
        if not task.packed:
            length = rng.randint(settings.min_len, settings.max_len)
        elif i % settings.batch_size == 0:
            length = rng.randint(settings.packed_min_len, settings.max_len)
        row = {"input_ids": [rng.choice(ordinary) for _ in range(length)]}
        if task.labels == "class":
            row["labels"] = rng.randrange(num_labels)
        elif task.labels == "token":
            row["labels"] = [rng.randrange(num_labels) for _ in range(length)]
        elif task.labels == "span":
            start = rng.randrange(length)
            row["start_positions"], row["end_positions"] = start, rng.randrange(start, length)
        elif task.labels == "sequence":
            row["labels"] = [rng.choice(ordinary) for _ in range(rng.randint(settings.min_len, settings.max_len))]
        rows.append(row)
    return rows


def build_collator(task: Task, tokenizer, model, settings: RunSettings):
    """A fresh collator of ``task``'s kind (fresh: the masked-LM one draws its masks from its own seeded
    generator, so each run, built anew, masks the same positions)."""
    from transformers import (
        DataCollatorForLanguageModeling,
        DataCollatorForSeq2Seq,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
    )

    kind = task.collator
    multiple = None if task.packed else settings.pad_to_multiple_of  # packed rows have nothing to pad
    if kind == "padding":
        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)
    if kind == "token-classification":
        return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=multiple)  # labels -100 on padding
    if kind == "causal-lm":  # labels = ids, -100 on padding
        return DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=multiple)
    if kind == "masked-lm":
        return DataCollatorForLanguageModeling(tokenizer, mlm=True, seed=settings.seed, pad_to_multiple_of=multiple)
    if kind == "seq2seq":  # decoder_input_ids from the model's own shift
        return DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=multiple)
    raise ValueError(f"unknown collator {kind!r}")


def batch_digest(inputs: dict) -> str:
    """A short hash of a batch's tensors: the two trainers must have been fed the same batches."""
    digest = hashlib.sha1()
    for key in sorted(inputs):
        value = inputs[key]
        if hasattr(value, "detach"):
            digest.update(key.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]
