#!/usr/bin/env python
"""Masked language modelling (BERT-style) with ORTTrainer: training steps run in ONNX Runtime.

Same arguments and semantics as Hugging Face's run_mlm example, plus every ORTTrainingArguments
flag (``--use_ort false`` trains the same script in plain PyTorch), ``--export_onnx DIR`` and
``--compare`` (runs the script through ORT and through PyTorch and prints both summaries).

    python examples/run_mlm/run_mlm.py --model_name_or_path <model dir> \
        --train_file ../shared/data/wikitext-2-raw/wiki.test.raw \
        --validation_file ../shared/data/wikitext-2-raw/wiki.valid.raw \
        --do_train --do_eval --max_seq_length 128 --output_dir /tmp/mlm

See README.md next to this file for the measured ORT vs PyTorch comparison.

ModuleWithLoss stays on (the ORTTrainingArguments default): the MLM loss then runs through an
``nn.CrossEntropyLoss`` inside the ORT graph and ORT's label sparsity computes the LM head on
the ~15% masked positions only. The evaluation set is masked once, up front, from a fixed seed,
so perplexities of different runs (ORT vs PyTorch) are measured on the same masked tokens.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import datasets
import numpy as np
import torch
import transformers
from datasets import load_dataset
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForTokenClassification,
    HfArgumentParser,
)

from ort_hf.report.summary import format_summary, run_compare, run_summary, write_summary
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
TEXT_EXTENSIONS = {"csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to train."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Checkpoint (hub id or local folder) to start from. Leave unset to train from scratch."},
    )
    model_type: str | None = field(
        default=None,
        metadata={"help": f"Model type when training from scratch: one of {', '.join(sorted(CONFIG_MAPPING.keys()))}."},
    )
    config_name: str | None = field(
        default=None, metadata={"help": "Config name or path, if not the same as model_name_or_path."}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Override config values when training from scratch, e.g. "
            "'n_embd=10,resid_pdrop=0.2,scale_attn_weights=false'."
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or path, if not the same as model_name_or_path."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to store models downloaded from the hub."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (tokenizers-backed) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Model version: branch, tag or commit id."})
    token: str | None = field(default=None, metadata={"help": "Hub token for private models."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow models defined in their hub repository (runs their code)."}
    )
    dtype: str | None = field(
        default=None,
        metadata={"help": "Load the weights in this dtype.", "choices": ["auto", "bfloat16", "float16", "float32"]},
    )
    export_onnx: str | None = field(
        default=None,
        metadata={"help": "After training, write an inference ONNX model (MLM logits), config and tokenizer here."},
    )

    def __post_init__(self):
        if self.config_overrides is not None and (self.config_name is not None or self.model_name_or_path is not None):
            raise ValueError(
                "--config_overrides only applies when training from scratch: drop --config_name / "
                "--model_name_or_path, or drop --config_overrides."
            )


@dataclass
class DataTrainingArguments:
    """What text to train and evaluate on, and how it becomes MLM examples."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset name (needs network access)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    train_file: str | None = field(
        default=None, metadata={"help": "Training text: a text file (one line per row), or csv/json/parquet."}
    )
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation text, same formats."})
    text_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the text (default: 'text', else the first column)."}
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={"help": "Share of the training data held out for evaluation when there is no validation set."},
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Tokens per example after tokenization (default: the tokenizer's max, at most 1024)."},
    )
    line_by_line: bool = field(
        default=False,
        metadata={
            "help": "One example per non-empty line (truncated). Default: concatenate the text and cut it "
            "into max_seq_length chunks."
        },
    )
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "line_by_line: pad every example to max_seq_length instead of per batch (static shapes)."},
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens masked for the MLM loss."})
    eval_masking_seed: int = field(
        default=1234,
        metadata={
            "help": "Seed of the one-time masking of the evaluation set (the same for every run, so "
            "perplexities compare like for like)."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training examples (debugging, quick runs)."}
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N evaluation examples."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo the cached tokenization."})

    def __post_init__(self):
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("Give --dataset_name or --train_file / --validation_file.")
        for path in (self.train_file, self.validation_file):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{path} is not a file.")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}.")


def _pop_flag(argv: list[str], flag: str) -> bool:
    found = flag in argv
    while flag in argv:
        argv.remove(flag)
    return found


# --- data ------------------------------------------------------------------------------------
def load_raw_datasets(data_args: DataTrainingArguments, model_args: ModelArguments) -> datasets.DatasetDict:
    hub = dict(cache_dir=model_args.cache_dir, token=model_args.token)
    if data_args.dataset_name is not None:
        raw = load_dataset(data_args.dataset_name, data_args.dataset_config_name, **hub)
        if "validation" not in raw:
            pct = data_args.validation_split_percentage
            split = raw["train"].train_test_split(test_size=pct / 100, shuffle=False)
            raw = datasets.DatasetDict({"train": split["train"], "validation": split["test"]})
        return raw
    files = {k: v for k, v in (("train", data_args.train_file), ("validation", data_args.validation_file)) if v}
    # Anything that is not csv/json/parquet is read as plain text, one row per line
    # (WikiText's .raw files included).
    extension = TEXT_EXTENSIONS.get(Path(next(iter(files.values()))).suffix.lstrip(".").lower(), "text")
    kwargs = {"keep_linebreaks": True} if extension == "text" else {}
    raw = load_dataset(extension, data_files=files, cache_dir=model_args.cache_dir, **kwargs)
    if "validation" not in raw and "train" in raw:
        split = raw["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, shuffle=False)
        raw = datasets.DatasetDict({"train": split["train"], "validation": split["test"]})
    return raw


def tokenize(
    raw: datasets.DatasetDict, tokenizer, data_args: DataTrainingArguments, max_seq_length: int, main_process_first
) -> datasets.DatasetDict:
    columns = next(iter(raw.values())).column_names
    text_column = data_args.text_column_name or ("text" if "text" in columns else columns[0])
    common = dict(
        batched=True,
        num_proc=data_args.preprocessing_num_workers,
        remove_columns=columns,
        load_from_cache_file=not data_args.overwrite_cache,
    )

    if data_args.line_by_line:
        padding = "max_length" if data_args.pad_to_max_length else False

        def tokenize_lines(examples):
            lines = [line for line in examples[text_column] if len(line) > 0 and not line.isspace()]
            # special_tokens_mask keeps [CLS]/[SEP]/[PAD] out of the masking.
            return tokenizer(
                lines, padding=padding, truncation=True, max_length=max_seq_length, return_special_tokens_mask=True
            )

        with main_process_first(desc="tokenizing lines"):
            return raw.map(tokenize_lines, desc="Tokenizing line by line", **common)

    def tokenize_all(examples):
        return tokenizer(examples[text_column], return_special_tokens_mask=True)

    def group_texts(examples):
        # Concatenate everything and cut into max_seq_length chunks; the remainder shorter than
        # one chunk is dropped, so every example has the same length and needs no padding.
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = (len(joined["input_ids"]) // max_seq_length) * max_seq_length
        return {k: [t[i : i + max_seq_length] for i in range(0, total, max_seq_length)] for k, t in joined.items()}

    with main_process_first(desc="tokenizing and grouping texts"):
        tokenized = raw.map(tokenize_all, desc="Tokenizing", **common)
        return tokenized.map(
            group_texts,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=f"Grouping texts in chunks of {max_seq_length}",
        )


def mask_once(dataset: datasets.Dataset, tokenizer, mlm_probability: float, seed: int) -> datasets.Dataset:
    """The evaluation set with MLM masking applied once from ``seed`` (HF's 80/10/10 rule), so
    every evaluation, in every run, scores the same masked positions."""
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=seed)

    def mask(example):
        batch = masker([example])  # one example: no padding added, the generator advances in order
        return {"input_ids": batch["input_ids"][0].tolist(), "labels": batch["labels"][0].tolist()}

    return dataset.map(mask, remove_columns=["special_tokens_mask"], desc="Masking the evaluation set once")


@dataclass
class MaskOrPadCollator:
    """Masks training batches; batches that already carry labels (the evaluation set, masked
    once by ``mask_once``) are only padded, labels with -100."""

    mask: DataCollatorForLanguageModeling
    pad: DataCollatorForTokenClassification

    def __call__(self, examples: list[dict]) -> dict:
        return (self.pad if "labels" in examples[0] else self.mask)(examples)


def preprocess_logits_for_metrics(logits, labels):
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)  # keeps only the predicted ids, not batch x seq x vocab floats


def compute_metrics(eval_preds) -> dict:
    preds, labels = eval_preds
    preds, labels = np.asarray(preds).reshape(-1), np.asarray(labels).reshape(-1)
    scored = labels != IGNORE_INDEX
    return {"accuracy": float((preds[scored] == labels[scored]).mean()) if scored.any() else float("nan")}


# --- model -----------------------------------------------------------------------------------
def load_model_and_tokenizer(model_args: ModelArguments):
    hub = dict(
        cache_dir=model_args.cache_dir,
        revision=model_args.model_revision,
        token=model_args.token,
        trust_remote_code=model_args.trust_remote_code,
    )
    if model_args.config_name or model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    elif model_args.model_type:
        config = CONFIG_MAPPING[model_args.model_type]()
        logger.warning("Training a new %s model from scratch.", model_args.model_type)
        if model_args.config_overrides:
            config.update_from_string(model_args.config_overrides)
    else:
        raise ValueError("Give --model_name_or_path, --config_name or --model_type.")

    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    if tokenizer_source is None:
        raise ValueError("Training a tokenizer is out of scope: give --tokenizer_name.")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, use_fast=model_args.use_fast_tokenizer, **hub)
    if tokenizer.mask_token is None:
        raise ValueError(f"The tokenizer of {tokenizer_source} has no mask token: it cannot be used for MLM.")

    if model_args.model_name_or_path:
        dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
        # A checkpoint without an MLM head (e.g. a sentence-embedding BertModel) loads its encoder
        # and initialises the head: transformers logs which weights are new.
        model = AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path, config=config, dtype=dtype, **hub)
    else:
        model = AutoModelForMaskedLM.from_config(config, trust_remote_code=model_args.trust_remote_code)

    embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embeddings:
        model.resize_token_embeddings(len(tokenizer))
    return model, tokenizer


# --- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str]):
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, ORTTrainingArguments))
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _pop_flag(argv, "--compare"):
        return run_compare(os.path.abspath(__file__), argv)
    model_args, data_args, training_args = parse_args(argv)

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.info("Training/evaluation parameters %s", training_args)

    transformers.set_seed(training_args.seed)  # before the model: a new MLM head is initialised from it
    raw = load_raw_datasets(data_args, model_args)
    model, tokenizer = load_model_and_tokenizer(model_args)

    max_seq_length = data_args.max_seq_length or min(tokenizer.model_max_length, 1024)
    if max_seq_length > tokenizer.model_max_length:
        logger.warning(
            "--max_seq_length %d exceeds the model's maximum %d: using %d.",
            max_seq_length,
            tokenizer.model_max_length,
            tokenizer.model_max_length,
        )
        max_seq_length = tokenizer.model_max_length
    tokenized = tokenize(raw, tokenizer, data_args, max_seq_length, training_args.main_process_first)

    train_dataset = eval_dataset = None
    if training_args.do_train:
        if "train" not in tokenized:
            raise ValueError("--do_train needs --train_file or a dataset with a train split.")
        train_dataset = tokenized["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if training_args.do_eval:
        if "validation" not in tokenized:
            raise ValueError("--do_eval needs --validation_file or a dataset with a validation split.")
        eval_dataset = tokenized["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
        with training_args.main_process_first(desc="masking the evaluation set"):
            eval_dataset = mask_once(eval_dataset, tokenizer, data_args.mlm_probability, data_args.eval_masking_seed)

    # Multiples of 8 help tensor cores with fp16 when padding per batch.
    pad_multiple = 8 if data_args.line_by_line and training_args.fp16 and not data_args.pad_to_max_length else None
    # Training masks are drawn from their own generator seeded from --seed (--data_seed if set),
    # not the global RNG: ORT and PyTorch consume the global RNG differently (dropout), and
    # both engines should see the same masked batches.
    collator = MaskOrPadCollator(
        mask=DataCollatorForLanguageModeling(
            tokenizer,
            mlm_probability=data_args.mlm_probability,
            pad_to_multiple_of=pad_multiple,
            seed=training_args.data_seed if training_args.data_seed is not None else training_args.seed,
        ),
        pad=DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_multiple),
    )

    trainer = ORTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics if training_args.do_eval else None,
    )

    train_metrics: dict = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        train_metrics = dict(train_result.metrics)
        train_metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", train_metrics)
        trainer.save_metrics("train", train_metrics)

    eval_metrics: dict = {}
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(eval_dataset)
        try:
            eval_metrics["perplexity"] = math.exp(eval_metrics["eval_loss"])
        except OverflowError:
            eval_metrics["perplexity"] = float("inf")
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)

    if model_args.export_onnx:
        path = trainer.export_onnx(model_args.export_onnx)
        logger.info("Inference ONNX model written to %s", path)

    if trainer.is_world_process_zero():
        summary = run_summary(trainer, train_metrics, eval_metrics, "perplexity")
        write_summary(summary, training_args.output_dir)
        print(format_summary(summary), flush=True)
    trainer.save_state()
    return 0


if __name__ == "__main__":
    sys.exit(main())
