"""A linear layer's three matrix products as ORT's CPU session computes them in a training graph
(MLAS, 2 intra-op threads, no spinning) against PyTorch's ``mm`` (MKL, on the process's threads):
the evidence for ``engine/cpu_weight_grad.py``, for its size bounds, and for leaving the other two
products ORT's.

- ``weight-grad`` (the default): the weight's gradient ``dY^T X``, ORT's ``Gemm`` and ``Transpose``
  against ort_hf's ``weight_grad``.
- ``forward-and-input-grad``: the forward product ``X W^T`` (ORT's ``MatMul`` of the weight's
  ``Transpose``, which the session fuses into one ``FusedMatMul``) and the input's gradient ``dY W``
  (``MatMul``), against ``mm`` writing into a buffer it keeps, as ORT's arena does.

Shapes are (token rows, weight rows, weight columns): the layers' projections and the LM heads of
the bench's workloads and of the held-out models in ``docs/benchmarks.md``. Per call, after two
warm-up calls, the fastest wall time of the repetitions (both use every core).

    python scripts/weight_grad_microbench.py --out docs/results/kernel-profiles/<cpu key>/weight-grad.json
    python scripts/weight_grad_microbench.py --products forward-and-input-grad \\
        --out docs/results/kernel-profiles/<cpu key>/forward-and-input-grad.json

A diagnostic, not a test: no figure is checked."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from onnx import TensorProto, helper

SHAPES = (  # (tokens, out, in)
    (2048, 688, 256),
    (2048, 1024, 384),
    (2048, 384, 1024),
    (2048, 768, 768),
    (2048, 3072, 768),
    (512, 1024, 1024),
    (2048, 30522, 256),
    (2048, 50257, 256),
    (2048, 32000, 384),
    (2048, 32768, 512),
    (2048, 50257, 384),
    (512, 37984, 512),
    (1024, 576, 576),  # the SmolLM-shaped held-out model's layers and head (scripts/heldout_models.py)
    (1024, 192, 576),
    (1024, 1536, 576),
    (1024, 576, 1536),
    (1024, 49152, 576),
    (512, 1536, 1536),  # the bench's lora-485m (Qwen2, 4 x 128 tokens): its frozen layers and head
    (512, 512, 1536),
    (512, 4224, 1536),
    (512, 1536, 4224),
    (256, 30522, 1536),  # the head on the labelled half of the rows
)


def _session(product: str, tokens: int, out: int, inp: int, threads: int):
    import onnxruntime as ort

    f = TensorProto.FLOAT
    x, w, dy = (("x", [tokens, inp]), ("w", [out, inp]), ("dy", [tokens, out]))
    if product == "weight-grad":  # the gradient Gemm and its Transpose, which the session fuses into one Gemm
        nodes = [
            helper.make_node("Gemm", ["x", "dy"], ["dw_t"], transA=1),
            helper.make_node("Transpose", ["dw_t"], ["dw"], perm=[1, 0]),
        ]
        inputs, output = (x, dy), ("dw", [out, inp])
    elif product == "forward":
        nodes = [
            helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "w_t"], ["y"]),
        ]
        inputs, output = (x, w), ("y", [tokens, out])
    else:  # input-grad
        nodes = [helper.make_node("MatMul", ["dy", "w"], ["dx"])]
        inputs, output = (dy, w), ("dx", [tokens, inp])
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, f, dims) for name, dims in inputs],
        [helper.make_tensor_value_info(output[0], f, output[1])],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.disable_prepacking", "1")  # as ORTModule's session
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _min_ms(fn, reps: int) -> float:
    fn()
    fn()
    walls = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return min(walls) * 1e3


def _weight_grad_row(tokens: int, out: int, inp: int, rng, args) -> dict:
    x = rng.standard_normal((tokens, inp)).astype(np.float32)
    dy = rng.standard_normal((tokens, out)).astype(np.float32)
    session = _session("weight-grad", tokens, out, inp, args.threads)
    tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
    ort_ms = _min_ms(lambda: session.run(None, {"x": x, "dy": dy}), args.reps)
    mm_ms = _min_ms(lambda: torch.ops.ort_hf.weight_grad(tdy, tx, args.threads), args.reps)
    return {"ort_gemm_ms": ort_ms, "mm_ms": mm_ms}


def _forward_and_input_grad_row(tokens: int, out: int, inp: int, rng, args) -> dict:
    x = rng.standard_normal((tokens, inp)).astype(np.float32)
    w = rng.standard_normal((out, inp)).astype(np.float32)
    dy = rng.standard_normal((tokens, out)).astype(np.float32)
    tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)
    forward, input_grad = (_session(p, tokens, out, inp, args.threads) for p in ("forward", "input-grad"))
    y, dx = torch.empty(tokens, out), torch.empty(tokens, inp)
    return {
        "ort_forward_ms": _min_ms(lambda: forward.run(None, {"x": x, "w": w}), args.reps),
        "mm_forward_ms": _min_ms(lambda: torch.mm(tx, tw.t(), out=y), args.reps),
        "ort_input_grad_ms": _min_ms(lambda: input_grad.run(None, {"dy": dy, "w": w}), args.reps),
        "mm_input_grad_ms": _min_ms(lambda: torch.mm(tdy, tw, out=dx), args.reps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", choices=("weight-grad", "forward-and-input-grad"), default="weight-grad")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", help="write the raw timings here as JSON")
    args = parser.parse_args()
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # ort_hf's kernels
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    measure = _weight_grad_row if args.products == "weight-grad" else _forward_and_input_grad_row
    rows = []
    for tokens, out, inp in SHAPES:
        gflop = 2 * tokens * out * inp / 1e9
        times = measure(tokens, out, inp, rng, args)
        rows.append({"tokens": tokens, "out": out, "in": inp, "gflop": gflop, **times})
        rates = ", ".join(f"{key.removesuffix('_ms')} {gflop / ms * 1e3:.0f}" for key, ms in times.items())
        print(f"{tokens} x {out} x {inp} ({gflop:.1f} GFLOP), GFLOP/s: {rates}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        facts = {
            "cpu": platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "products": args.products,
            "threads": args.threads,
            "reps": args.reps,
            "results": rows,
        }
        Path(args.out).write_text(json.dumps(facts, indent=1) + "\n")


if __name__ == "__main__":
    main()
