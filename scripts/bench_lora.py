"""LoRA (or full fine-tune) on a Qwen2-shaped causal LM built in code: ms/step and peak RSS of the
plain HF Trainer and of ORTTrainer, one engine per process (issue 30's measurement).

    python scripts/bench_lora.py --size 55m --engine ort     # one run; prints one JSON line
    python scripts/bench_lora.py --size 55m --rounds 2       # eager and ORT alternating, each in a fresh process

Random tokens, seq 128, batch 4, the first half of each row's labels masked (a prompt), dropout 0,
SGD (the optimizer is the same for both engines and not what is compared).

- ``step_ms``: median wall time of the steps after ``--warmup``; ``step_cpu_ms``: their median
  process CPU time (on a loaded machine, with ``--threads 1``, the steadier measure of the work);
  ``first_step_s``: step 1 (ORT: export, gradient graph and session).
- ``warmup_peak_mb``: the process's VmHWM up to the end of warm-up (model, export, first steps);
  ``train_peak_mb``: its VmHWM over the timed steps only (reset through /proc/self/clear_refs);
  ``peak_before_train_mb``: the VmHWM once the model is built.
- ORT only: ``export_peak_mb``, the VmHWM from the start of training to the end of the export's
  trace (its structure pass included), against ``rss_at_train_begin_mb``; ``graph_gradients``, the
  gradients ORT's training graph outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {  # hidden, layers, heads, kv heads, intermediate; vocab 32000, lm_head untied
    "55m": (512, 8, 8, 4, 1408),
    "200m": (1024, 12, 16, 8, 2816),
    "485m": (1536, 16, 12, 4, 4224),
}
VOCAB, SEQ, BATCH = 32000, 128, 4


def _one_run(args) -> dict:
    import torch
    import transformers as tf
    from datasets import Dataset

    from ort_hf.callbacks.memory import ProcessMemory

    memory = ProcessMemory()  # on CPU: the kernel's VmHWM / VmRSS, the peak reset through clear_refs

    hidden, layers, heads, kv, inter = SIZES[args.size]
    torch.manual_seed(0)
    config = tf.Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=SEQ,
                            tie_word_embeddings=False, use_cache=False, attention_dropout=0.0)
    model = tf.Qwen2ForCausalLM(config)
    if args.lora_r:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=args.lora_r, lora_alpha=16,
                                                           lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (BATCH * (args.steps + 1), SEQ), generator=g)
    labels = ids.masked_fill(torch.arange(SEQ) < SEQ // 2, -100)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})

    times: list[float] = []
    cpu_times: list[float] = []  # the process's CPU time: with one thread each, the work, whatever the load
    warmup_peak: list[float] = []
    export: dict[str, float] = {}

    def at_trace_end(module, inputs, output):
        # The trace is ORT's export's last forward: the peak so far covers its structure pass too.
        if torch.jit.is_tracing():
            export["export_peak_mb"] = round(memory.peak_mb())

    model.register_forward_hook(at_trace_end)

    class StepTimer(tf.TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            export["rss_at_train_begin_mb"] = round(memory.current_mb())
            memory.reset_peak()

        def on_step_begin(self, a, state, control, **kw):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.start)
            cpu_times.append(time.process_time() - self.cpu_start)
            if len(times) == args.warmup:
                warmup_peak.append(memory.peak_mb())
                memory.reset_peak()  # what follows is the steady training peak

    common = dict(output_dir=f"/tmp/bench_lora_{os.getpid()}", max_steps=args.steps, per_device_train_batch_size=BATCH,
                  learning_rate=1e-4, optim="sgd", seed=0, report_to=[], save_strategy="no", logging_steps=1,
                  disable_tqdm=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engine == "ort":
        from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

        targs = ORTTrainingArguments(ort_fallback="disable", ort_log_level="ERROR", ort_memory_callback=False,
                                     ort_intra_op_threads=args.threads, **common)
        trainer = ORTTrainer(model=model, args=targs, train_dataset=data, callbacks=[StepTimer()])
    else:
        targs = tf.TrainingArguments(**common)
        trainer = tf.Trainer(model=model, args=targs, train_dataset=data, callbacks=[StepTimer()])
    peak_before_train = memory.peak_mb()
    trainer.train()
    train_peak = memory.peak_mb()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result = {"size": args.size, "engine": args.engine, "threads": args.threads, "lora_r": args.lora_r,
              "params_m": round(params / 1e6, 1), "trainable_m": round(trainable / 1e6, 3),
              "step_ms": round(1000 * statistics.median(times[args.warmup:]), 1),
              "step_cpu_ms": round(1000 * statistics.median(cpu_times[args.warmup:]), 1),
              "first_step_s": round(times[0], 2), "train_peak_mb": round(train_peak),
              "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
              "peak_before_train_mb": round(peak_before_train), "warmup_peak_mb": round(warmup_peak[0])}
    if args.engine == "ort":
        status = trainer.ort_engine_status()
        assert status.backend == "ort", status
        graph = trainer._ort_engine_module.training_graph()
        result.update(graph_gradients=len(graph.graph.output), export_s=round(status.export_seconds, 2), **export)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="55m")
    parser.add_argument("--engine", choices=["eager", "ort"])
    parser.add_argument("--lora_r", type=int, default=8, help="0: full fine-tune")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="PyTorch's threads (eager) and ORT's intra-op threads (ORT); default: each engine's own")
    parser.add_argument("--rounds", type=int, default=1, help="without --engine: eager/ORT pairs, alternating")
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(_one_run(args)), flush=True)
        return
    for _ in range(args.rounds):
        for engine in ("eager", "ort"):
            cmd = [sys.executable, __file__, "--engine", engine, "--size", args.size, "--lora_r", str(args.lora_r),
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
            cmd += ["--threads", str(args.threads)] if args.threads else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            print(out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
