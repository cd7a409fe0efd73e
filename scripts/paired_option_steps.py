"""One ORTTrainer option on and off, timed in one process so that both sides see the same machine.

Separate processes on a shared VM drift by tens of percent between invocations (eager's MLM step
2,220 to 2,700 ms within one ``ort-hf bench``); this compares within one process instead. Two
ORTTrainers (the option ``True`` and ``False``) train copies of ``ort-hf bench``'s model of a
workload (``--model_dir``, ``--seq_len``, ``--batch_size`` as the bench takes them); their
``train()`` calls alternate (on, off, off, on, ...), each call ``--steps`` optimizer steps; every
step but each call's first (the first call's export and session build, then the data loader's
start) is timed. The batches are random token ids of the workload's shape (timing does not depend
on the values): 15% of positions labelled for ``mlm``, the second half for ``lora``, every position
for ``clm``, and rows of 8 to half the workload's length (SST-2's sentences are short), padded to
the batch's longest, for ``cls``.

    python scripts/paired_option_steps.py --workload lora-200m --option cpu_linear_product_swap --out FILE.json
    python scripts/paired_option_steps.py --workload clm --model_dir /tmp/heldout/gpt2-6x768 --seq_len 256 \
        --batch_size 4 --option cpu_linear_product_swap   # scripts/heldout_models.py's
    python scripts/paired_option_steps.py --workload mlm --option cpu_linear_product_min_dim --values 384,768

``--values`` gives the option's two sides (JSON, default ``true,false``); the first is the one the
summary calls "on".

``--option torch_flash_operators`` is no ORTOptions switch: both trainers take the defaults, and for
the ``False`` side's calls ort_hf's flash-attention wrappers (``engine/csrc/cpu_flash_attention.cpp``)
are registered over by calls of PyTorch's own operators, as the wrappers were before they wrote the
kernel's results themselves: the same kernel and bits, its results where PyTorch's operators put them.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def _rows(task: str, seq_len: int, vocab: int, count: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        length = int(torch.randint(8, seq_len // 2 + 1, (1,), generator=g)) if task == "cls" else seq_len
        ids = torch.randint(3, vocab, (length,), generator=g)
        if task == "mlm":
            labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
        elif task == "lora":
            labels = torch.cat([torch.full((seq_len // 2,), -100), ids[seq_len // 2 :]])
        elif task == "cls":
            labels = torch.randint(0, 2, (), generator=g)
        else:
            labels = ids.clone()
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def _collate(rows: list[dict]) -> dict:
    """Pad to the batch's longest row (token labels with -100), with the attention mask."""
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = r["input_ids"]
        mask[i, : len(r["input_ids"])] = 1
    if rows[0]["labels"].dim() == 0:
        labels = torch.stack([r["labels"] for r in rows])
    else:
        labels = torch.full_like(ids, -100)
        for i, r in enumerate(rows):
            labels[i, : len(r["labels"])] = r["labels"]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


TORCH_FLASH_OPERATORS = "torch_flash_operators"


def _masks_the_future(mask) -> bool:
    if mask is None or mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        return False
    above = torch.ones(mask.shape[-2:], dtype=torch.bool).triu(1)
    return bool(torch.isneginf(mask[..., above]).all())


def _torch_flash_operators():
    """A library registering calls of PyTorch's flash-attention operators over ort_hf's wrappers, with
    the wrappers' thread count and their causal flag (``_destroy()`` puts the wrappers back)."""
    import warnings

    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # ort_hf's kernels registered first

    def threads_for(threads, call):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return call()
        finally:
            torch.set_num_threads(before)

    def forward(q, k, v, dropout_p, is_causal, attn_mask, scale, threads):
        causal = is_causal or _masks_the_future(attn_mask)
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return threads_for(threads, lambda: op(q, k, v, dropout_p, causal, attn_mask=attn_mask, scale=scale))

    def backward(grad, q, k, v, out, lse, dropout_p, is_causal, attn_mask, scale, threads):
        causal = is_causal or _masks_the_future(attn_mask)
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        return threads_for(
            threads, lambda: op(grad, q, k, v, out, lse, dropout_p, causal, attn_mask=attn_mask, scale=scale)
        )

    library = torch.library.Library("ort_hf", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that a kernel is registered over
        library.impl("flash_attention", forward, "CPU")
        library.impl("flash_attention_backward", backward, "CPU")
    return library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", required=True, help="an ort-hf bench workload (mlm, clm, lora-200m, ...)")
    parser.add_argument(
        "--option",
        required=True,
        help="an ORTOptions switch, without ort_ (cpu_linear_product_swap); several, comma-separated, switch "
        f"together; or {TORCH_FLASH_OPERATORS} (above)",
    )
    parser.add_argument("--values", default="true,false", help="the option's two sides, JSON (default true,false)")
    parser.add_argument("--calls", type=int, default=4, help="train() calls per side (default 4)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per call (default 5)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model_dir", help="ort-hf bench's --model_dir (a causal LM's folder for --workload clm)")
    parser.add_argument("--seq_len", type=int, help="instead of the workload's")
    parser.add_argument("--batch_size", type=int, help="instead of the workload's")
    parser.add_argument("--out", help="write the step times and the summary to this JSON file")
    args = parser.parse_args()

    from transformers import TrainerCallback

    from ort_hf import ORTTrainer, ORTTrainingArguments
    from ort_hf.bench.cpu import cpu_record, describe
    from ort_hf.bench.models import build_model, load_tokenizer
    from ort_hf.bench.spec import WORKLOADS, BenchSettings

    torch.set_num_threads(args.threads)
    workload = WORKLOADS[args.workload]
    settings = BenchSettings(model_dir=args.model_dir, seq_len=args.seq_len, batch_size=args.batch_size)
    model = build_model(workload, settings, load_tokenizer(settings))
    batch_size = settings.batch_for(workload)
    rows = _rows(workload.task, settings.seq_for(workload), model.config.vocab_size, batch_size * args.steps)

    class Clock(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_train_begin(self, *_, **__):
            self.first = True

        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if not self.first:
                self.times.append((time.perf_counter() - self.start) * 1e3)
            self.first = False

    first, second = (json.loads(v) for v in args.values.split(","))
    out = tempfile.mkdtemp()
    sides = {}
    for value in (first, second):
        training_args = ORTTrainingArguments(
            output_dir=f"{out}/{value}",
            per_device_train_batch_size=batch_size,
            max_steps=args.steps,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=10**6,
            dataloader_num_workers=0,
            ort_fallback="disable",
            ort_intra_op_threads=args.threads,
            **({} if args.option == TORCH_FLASH_OPERATORS else {f"ort_{n}": value for n in args.option.split(",")}),
        )
        clock = Clock()
        trainer = ORTTrainer(
            model=copy.deepcopy(model),
            args=training_args,
            train_dataset=rows,
            data_collator=_collate,
            callbacks=[clock],
        )
        sides[value] = (trainer, clock)
    for call in range(args.calls):
        for value in (first, second) if call % 2 == 0 else (second, first):
            trainer, clock = sides[value]
            library = _torch_flash_operators() if args.option == TORCH_FLASH_OPERATORS and value == second else None
            trainer.train()
            if library is not None:
                library._destroy()
            print(
                f"call {call}, {args.option}={value}: steps {[round(t) for t in clock.times[-(args.steps - 1) :]]} ms"
            )
    on, off = sides[first][1].times, sides[second][1].times
    summary = {
        "workload": args.workload,
        "model_dir": args.model_dir,
        "seq_len": settings.seq_for(workload),
        "batch_size": batch_size,
        "option": args.option,
        "values": [first, second],
        "cpu": describe(cpu_record()),
        "on_median_ms": statistics.median(on),
        "off_median_ms": statistics.median(off),
        "off_over_on": statistics.median(off) / statistics.median(on),
    }
    print(
        f"{args.workload} on {summary['cpu']}: {args.option}={first} median step {summary['on_median_ms']:.0f} ms, "
        f"{second} {summary['off_median_ms']:.0f} ms ({len(on)} steps each); {second} over {first} {summary['off_over_on']:.3f}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps({**summary, "on_ms": on, "off_ms": off, "argv": sys.argv[1:]}, indent=1))


if __name__ == "__main__":
    main()
