"""The fused LM-head loss's work on one chunk of rows (``module_with_loss/chunked_lm_loss.py``), each
operation timed alone at the chunk shapes of the bench's and the held-out models' heads: the three
products on each library the loss can run them on (ORT's MLAS sessions of
``engine/cpu_head_products.py``, PyTorch's ``mm``), a pass for the row maxima (one ``max`` with
indices, one ``amax``: what the loss would pay to take them; it reads its loss off the softmax
instead), the in-place softmax, and the whole Function (forward and backward over all the rows, on
this CPU's default products), the reason for each choice of the loss's chunk loop.

Per operation, after two warm-up calls, the fastest wall time of the repetitions, on every core;
the chunk is ``CHUNK_ELEMENTS`` logits (``rows`` = that over the vocabulary).

    python scripts/fused_loss_chunk_microbench.py > docs/results/kernel-profiles/<cpu key>/fused-loss-chunk.txt

A diagnostic, not a test: no figure is checked."""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch
from weight_grad_microbench import _min_ms  # the fastest of reps after two warm-up calls, in ms

HEADS = (  # (tokens a step, hidden, vocabulary): the bench's clm and clm-gpt2, the held-out models
    ("clm (tiny Llama)", 2048, 256, 30522),
    ("clm-gpt2", 2048, 256, 50257),
    ("Llama 6 x 384", 2048, 384, 32000),
    ("Mistral 4 x 512", 2048, 512, 32768),
    ("SmolLM2-135M shape", 1024, 576, 49152),
    ("GPT-2 6 x 384", 2048, 384, 50257),
)


def _chunk_rows(name, tokens, hidden, vocab, threads, reps) -> None:
    from ort_hf.engine.cpu_head_products import HeadProducts
    from ort_hf.module_with_loss.chunked_lm_loss import CHUNK_ELEMENTS

    rows = min(tokens, CHUNK_ELEMENTS // vocab)
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(rows, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.02
    z, dh, dw = torch.randn(rows, vocab, generator=g), torch.empty(rows, hidden), torch.empty(vocab, hidden)
    ort = HeadProducts(threads, forward=True, input_grad=True, weight_grad=True)
    gflop = 2 * rows * hidden * vocab / 1e9
    products = {
        "forward, ORT": lambda: ort.forward_product(h, w, z),
        "forward, mm": lambda: torch.mm(h, w.t(), out=z),
        "input gradient, ORT": lambda: ort.input_grad(z, w, dh),
        "input gradient, mm": lambda: torch.mm(z, w, out=dh),
        "weight gradient (added), ORT": lambda: ort.weight_grad(z, h, dw, True),
        "weight gradient (added), mm": lambda: dw.addmm_(z.t(), h),
    }
    passes = {
        "row maxima: max with indices": lambda: z.max(dim=1, keepdim=True),
        "row maxima: amax": lambda: z.amax(dim=1),
        "softmax in place": lambda: torch.softmax(z, dim=1, out=z),
    }
    print(f"{name}: chunk {rows} x {vocab} logits, hidden {hidden}")
    for label, fn in products.items():
        ms = _min_ms(fn, reps)
        print(f"  {label:34s} {ms:8.1f} ms  {gflop / ms * 1e3:5.0f} GFLOP/s")
    for label, fn in passes.items():
        print(f"  {label:34s} {_min_ms(fn, reps):8.1f} ms")


def _whole_function(name, tokens, hidden, vocab, threads, reps) -> None:
    from ort_hf.engine.cpu_head_products import (
        HeadProducts,
        ort_input_grad_wanted,
        ort_product_wanted,
        ort_weight_grad_wanted,
    )
    from ort_hf.module_with_loss import chunked_lm_loss

    chunked_lm_loss.PRODUCTS["bench"] = HeadProducts(
        threads, ort_product_wanted(None), ort_input_grad_wanted(None), ort_weight_grad_wanted(None)
    )
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)

    def step():
        h.grad = w.grad = None
        chunked_lm_loss.chunked_linear_cross_entropy(h, w, None, labels, -100, threads, "bench").backward()

    products = chunked_lm_loss.PRODUCTS["bench"].name
    print(f"  the whole Function, {tokens} rows, forward and backward ({products}): {_min_ms(step, reps):.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    from ort_hf.bench.cpu import cpu_record

    torch.set_num_threads(args.threads)
    print(f"$ python {' '.join(['scripts/fused_loss_chunk_microbench.py', *sys.argv[1:]])}")
    print(f"{cpu_record()}, {args.threads} threads, torch {torch.__version__}, {platform.python_version()}")
    for head in HEADS:
        _chunk_rows(*head, args.threads, args.reps)
        _whole_function(*head, args.threads, args.reps)


if __name__ == "__main__":
    main()
