"""ORT's per-node profile of a short ORTTrainer run per model family, summed by op type (issue 44):
where ORT's CPU node time goes, the ground for the kernel swaps of ``engine/cpu_grad_swaps.py``.

Each family is a model built in code at tiny-but-realistic widths (hidden 256, 2 layers, 4 for the
encoders, its real vocabulary), the dropout it ships with, random token ids: causal LMs at batch 8 x
256, classifiers at 16 x 128, seq2seq at 16 x 128 with 64 target tokens; 4 steps (``--steps``) with
``--ort_profile_dir``. One process a family:

    python scripts/kernel_profiles.py llama bert t5 --out_dir docs/results/kernel-profiles/<cpu key> [--tag after]
    python scripts/kernel_profiles.py llama --tag before --off cpu_norm_grad_swap cpu_softmax_grad_swap \\
        cpu_relu_grad_swap
    python scripts/kernel_profiles.py --model_dir /tmp/heldout/llama-6x384-v32k --shape 4 512 \\
        --out_dir docs/results/kernel-profiles/<cpu key>   # a causal or masked LM's folder (scripts/heldout_models.py)
    python scripts/kernel_profiles.py --model_dir ... --tag chunked --on chunked_lm_loss
    python scripts/kernel_profiles.py --bench_workload clm --out_dir ...          # ort-hf bench's model
    python scripts/kernel_profiles.py --bench_workload clm --eager --out_dir ...  # the same, PyTorch's run
    python scripts/kernel_profiles.py --model_dir ... --steps 8 --by_run --tag by-run  # and each graph run's

writes ``<family>-<tag>.txt``: ORT's node time by op type, largest first (the shares hold on a busy
machine better than the times, since every kernel is slowed alike); with ``--eager``, PyTorch's own
run under ``torch.profiler`` instead, self CPU time by ATen op (the optimizer's ops included, which
ORT's profile leaves out), so that the two engines' products can be set side by side. A diagnostic,
not a test."""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# the ATen nodes of engine/cpu_grad_swaps.py, by the last part of their name
SWAP_KERNELS = (
    "native_layer_norm_backward",
    "ort_hf_rms_norm_backward",
    "ort_hf_softmax_backward",
    "ort_hf_relu_backward",
)
FAMILIES = ("llama", "qwen2", "gemma", "phi3", "neox", "opt", "bert", "roberta", "deberta", "electra", "t5", "bart")


def _model(family: str):
    import transformers as tf

    h, i, n, heads = 256, 1024, 2, 4
    causal = dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=heads, max_position_embeddings=512)
    encoder = dict(hidden_size=h, intermediate_size=i, num_hidden_layers=4, num_attention_heads=heads, num_labels=2)
    seq2seq = dict(d_model=h, decoder_start_token_id=0)
    specs = {
        "llama": (
            "clm",
            tf.LlamaForCausalLM,
            tf.LlamaConfig(vocab_size=32000, intermediate_size=688, num_key_value_heads=2, **causal),
        ),
        "qwen2": (
            "clm",
            tf.Qwen2ForCausalLM,
            tf.Qwen2Config(
                vocab_size=151936, intermediate_size=688, num_key_value_heads=2, tie_word_embeddings=True, **causal
            ),
        ),
        "gemma": (
            "clm",
            tf.GemmaForCausalLM,
            tf.GemmaConfig(
                vocab_size=256000,
                intermediate_size=i,
                num_key_value_heads=1,
                head_dim=64,
                hidden_activation="gelu_pytorch_tanh",
                **causal,
            ),
        ),
        "phi3": (
            "clm",
            tf.Phi3ForCausalLM,
            tf.Phi3Config(vocab_size=32064, intermediate_size=688, pad_token_id=0, **causal),
        ),
        "neox": (
            "clm",
            tf.GPTNeoXForCausalLM,
            tf.GPTNeoXConfig(vocab_size=50304, intermediate_size=i, rotary_pct=0.25, **causal),
        ),
        "opt": ("clm", tf.OPTForCausalLM, tf.OPTConfig(vocab_size=50272, ffn_dim=i, word_embed_proj_dim=h, **causal)),
        "bert": ("cls", tf.BertForSequenceClassification, tf.BertConfig(vocab_size=30522, **encoder)),
        "roberta": (
            "cls",
            tf.RobertaForSequenceClassification,
            tf.RobertaConfig(vocab_size=50265, max_position_embeddings=514, **encoder),
        ),
        "deberta": (
            "cls",
            tf.DebertaV2ForSequenceClassification,
            tf.DebertaV2Config(
                vocab_size=128100,
                relative_attention=True,
                position_buckets=256,
                pos_att_type=["p2c", "c2p"],
                max_relative_positions=-1,
                position_biased_input=False,
                norm_rel_ebd="layer_norm",
                share_att_key=True,
                **encoder,
            ),
        ),
        "electra": (
            "cls",
            tf.ElectraForSequenceClassification,
            tf.ElectraConfig(vocab_size=30522, embedding_size=128, **encoder),
        ),
        "t5": (
            "s2s",
            tf.T5ForConditionalGeneration,
            tf.T5Config(vocab_size=32128, d_ff=i, d_kv=64, num_layers=n, num_heads=heads, pad_token_id=0, **seq2seq),
        ),
        "bart": (
            "s2s",
            tf.BartForConditionalGeneration,
            tf.BartConfig(
                vocab_size=50265,
                encoder_ffn_dim=i,
                decoder_ffn_dim=i,
                encoder_layers=n,
                decoder_layers=n,
                encoder_attention_heads=heads,
                decoder_attention_heads=heads,
                max_position_embeddings=512,
                **seq2seq,
            ),
        ),
    }
    return specs[family]


def _bench_model(name: str):
    """(task, model, config) of ``ort-hf bench``'s workload ``name``, built as the bench builds it."""
    from ort_hf.bench.models import build_model, load_tokenizer
    from ort_hf.bench.spec import WORKLOADS, BenchSettings

    workload, settings = WORKLOADS[name], BenchSettings()
    model = build_model(workload, settings, load_tokenizer(settings))
    return workload.task, model, model.config


def _train(
    family: str,
    profile_dir: str,
    off: list[str],
    model_dir: str | None = None,
    shape=None,
    on: list[str] = (),
    bench_workload: str | None = None,
    eager: bool = False,
    steps: int = 4,
) -> None:
    """One profiled run (in its own process); ``model_dir``: a causal or masked LM's folder instead of a
    family; ``bench_workload``: ort-hf bench's model of that workload; ``eager``: PyTorch's run, under
    torch.profiler (its table is written to ``profile_dir``/eager.txt)."""
    import time

    import torch
    from transformers import TrainerCallback

    from ort_hf import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments, ORTTrainer, ORTTrainingArguments

    if bench_workload:
        from ort_hf.bench.spec import WORKLOADS

        task, model, config = _bench_model(bench_workload)
        shape = shape or (WORKLOADS[bench_workload].batch_size, WORKLOADS[bench_workload].seq_len)
    elif model_dir:
        import transformers as tf

        config = tf.AutoConfig.from_pretrained(model_dir)
        masked = any(name.endswith("ForMaskedLM") for name in config.architectures or ())
        task = "mlm" if masked else "clm"
        model = (tf.AutoModelForMaskedLM if masked else tf.AutoModelForCausalLM).from_pretrained(model_dir)
    else:
        task, cls, config = _model(family)
        torch.manual_seed(0)
        model = cls(config)
    batch, seq = shape or ((8, 256) if task == "clm" else (16, 128))
    masked_rows = torch.Generator().manual_seed(1)
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(batch * (steps + 1)):
        ids = torch.randint(3, config.vocab_size, (seq,), generator=g)
        row = {"input_ids": ids, "attention_mask": torch.ones(seq, dtype=torch.long)}
        if task == "clm":
            row["labels"] = ids.clone()
        elif task == "lora":  # as the bench's LoRA rows: the first half a prompt, out of the loss
            row["labels"] = torch.cat([torch.full((seq // 2,), -100), ids[seq // 2 :]])
        elif task == "mlm":  # 15% of positions predicted, as the collator's default
            row["labels"] = torch.where(torch.rand(seq, generator=masked_rows) < 0.15, ids, -100)
        elif task == "cls":
            row["labels"] = int(torch.randint(0, 2, (1,), generator=g))
        else:
            row["labels"] = torch.randint(3, config.vocab_size, (64,), generator=g)
        rows.append(row)

    class StepClock(TrainerCallback):
        """Prints each step's wall time (the first step holds the export and the session)."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            print(f"step {state.global_step}: {(time.perf_counter() - self.start) * 1e3:.0f} ms", flush=True)

    args_cls, trainer_cls = (
        (ORTSeq2SeqTrainingArguments, ORTSeq2SeqTrainer) if task == "s2s" else (ORTTrainingArguments, ORTTrainer)
    )
    with tempfile.TemporaryDirectory() as out:
        args = args_cls(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=steps,
            report_to=[],
            save_strategy="no",
            **(
                {"use_ort": False}
                if eager
                else {"ort_profile_dir": profile_dir, "ort_fallback": "disable", "ort_preflight": "never"}
            ),
            **{f"ort_{option}": False for option in off},
            **{f"ort_{option}": True for option in on},
        )
        trainer = trainer_cls(model=model, args=args, train_dataset=rows, callbacks=[StepClock()])
        if not eager:
            trainer.train()
            return
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            trainer.train()
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        Path(profile_dir, "eager.txt").write_text(eager_summary(profiler.key_averages()))


def eager_summary(averages, top: int = 25) -> str:
    """PyTorch's self CPU time by ATen op, largest first, in ``summary``'s format."""
    rows = sorted((a for a in averages if a.self_cpu_time_total > 0), key=lambda a: -a.self_cpu_time_total)
    total = sum(a.self_cpu_time_total for a in rows)
    lines = [f"total self CPU us {total:.0f} (torch.profiler; the optimizer's ops included)"]
    for a in rows[:top]:
        lines.append(
            f"{a.key:40s} {a.self_cpu_time_total / total * 100:5.1f}% {a.self_cpu_time_total / 1e3:9.1f}ms n={a.count}"
        )
    return "\n".join(lines) + "\n"


def _op_name(event: dict) -> str:
    """A node event's op type; ATen nodes by the kernel they call where ``summary`` says."""
    op = event["args"].get("op_name")
    kernel = event["name"].removesuffix("_kernel_time").rsplit("/", 1)[-1]
    if op == "ATen" and (kernel in SWAP_KERNELS or kernel.startswith("ort_hf_")):
        op = f"ATen:{kernel}"
    return op


def summary(events: list[dict], top: int = 25) -> str:
    """ORT's node time by op type, largest first; ATen nodes by the kernel they call (the last part
    of their name: ``cpu_kernel_swaps`` names each after its kernel, ``ort_hf_...`` for ort_hf's own;
    ``ATen`` alone for the others); ``events``: ORT's profile, as its JSON file holds them."""
    by_op, calls = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = _op_name(event)
            by_op[op] += event["dur"]
            calls[op] += 1
    total = sum(by_op.values())
    lines = [f"total node us {total}"]
    for op, us in by_op.most_common(top):
        lines.append(f"{op:40s} {us / total * 100:5.1f}% {us / 1e3:9.1f}ms n={calls[op]}")
    return "\n".join(lines) + "\n"


def by_run(events: list[dict], top: int = 6) -> str:
    """ORT's node time in each run of the graph (each ``SequentialExecutor::Execute``: a step's forward,
    then its backward), by op type, the ``top`` largest: how a kernel's time moves from step to step."""
    runs = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e["name"].endswith("::Execute")
    )
    by_op = [collections.Counter() for _ in runs]
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        run = next((i for i, (start, end) in enumerate(runs) if start <= event["ts"] <= end), None)
        if run is not None:
            by_op[run][_op_name(event)] += event["dur"]
    lines = ["", "node ms by graph run (forward and backward alternate, from the first step)"]
    for i, ops in enumerate(by_op):
        cells = ", ".join(f"{op} {us / 1e3:.0f}" for op, us in ops.most_common(top))
        lines.append(f"run {i}: total {sum(ops.values()) / 1e3:.0f}: {cells}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help=f"from {', '.join(FAMILIES)}")
    parser.add_argument(
        "--model_dir", help="profile this causal or masked LM's folder (named after it) instead of families"
    )
    parser.add_argument(
        "--bench_workload", help="profile ort-hf bench's model of this workload (clm, clm-gpt2, lora-485m, ...)"
    )
    parser.add_argument("--eager", action="store_true", help="profile PyTorch's run (torch.profiler) instead of ORT's")
    parser.add_argument("--shape", type=int, nargs=2, metavar=("BATCH", "SEQ"), help="default 8 256 (clm), 16 128")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--tag", default="after")
    parser.add_argument("--off", nargs="*", default=[], help="ORTOptions switches to turn off (the 'before' runs)")
    parser.add_argument("--on", nargs="*", default=[], help="ORTOptions switches to turn on (e.g. chunked_lm_loss)")
    parser.add_argument("--profile_dir", help="keep ORT's raw profiles here (default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps to profile (default 4)")
    parser.add_argument(
        "--by_run", action="store_true", help="also ORT's node time of each graph run (forward, backward) by op type"
    )
    parser.add_argument("--_run", help=argparse.SUPPRESS)  # internal: the one-family child process
    args = parser.parse_args()
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown or not (args.families or args.model_dir or args.bench_workload):
        parser.error(f"name families from {', '.join(FAMILIES)} (not {unknown}), --model_dir or --bench_workload")
    if args._run:
        family = args.families[0] if args.families else ""
        _train(
            family,
            args._run,
            args.off,
            args.model_dir,
            args.shape,
            args.on,
            args.bench_workload,
            args.eager,
            args.steps,
        )
        return
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = (["--model_dir", args.model_dir] if args.model_dir else []) + (
        ["--shape", *map(str, args.shape)] if args.shape else []
    )
    extra += (["--bench_workload", args.bench_workload] if args.bench_workload else []) + (
        ["--eager"] if args.eager else []
    )
    extra += ["--steps", str(args.steps)]
    named = [f"bench-{args.bench_workload}"] if args.bench_workload else []
    for family in named or ([Path(args.model_dir).name] if args.model_dir else args.families):
        with tempfile.TemporaryDirectory() as tmp:
            profile_dir = str(Path(args.profile_dir) / f"{family}-{args.tag}") if args.profile_dir else tmp
            families = [] if args.model_dir or args.bench_workload else [family]
            cmd = [sys.executable, __file__, *families, "--out_dir", str(out), "--_run", profile_dir, *extra]
            cmd += ["--off", *args.off, "--on", *args.on]
            subprocess.run(cmd, check=True)
            if args.eager:
                text = Path(profile_dir, "eager.txt").read_text()
            else:  # the training session's profile
                profile = max(Path(profile_dir).glob("*.json"), key=lambda p: p.stat().st_size)
                events = json.loads(profile.read_text())
                text = summary(events) + (by_run(events) if args.by_run else "")
        (out / f"{family}-{args.tag}.txt").write_text(text)
        print(f"== {family} ({args.tag})\n{text}", flush=True)


if __name__ == "__main__":
    main()
