"""A linear weight's gradient ``dY^T X`` as ORT's CPU Gemm computes it in a training graph (MLAS,
2 intra-op threads, no spinning) against ort_hf's ``weight_grad`` (PyTorch's ``mm``, MKL, on the
process's threads): the evidence for ``engine/cpu_weight_grad.py`` and for its size bounds.

Shapes are (token rows, weight rows, weight columns): the layers' projections and the LM heads of
the bench's workloads and of the held-out models in ``docs/benchmarks.md``. Per call, after two
warm-up calls, the fastest wall time of the repetitions (both use every core).

    python scripts/weight_grad_microbench.py --out docs/results/kernel-profiles/<cpu key>/weight-grad.json

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
)


def _gemm_session(tokens: int, out: int, inp: int, threads: int):
    import onnxruntime as ort

    f = TensorProto.FLOAT
    nodes = [  # what ORT's session runs: the gradient Gemm and its Transpose fused into one Gemm
        helper.make_node("Gemm", ["x", "dy"], ["dw_t"], transA=1),
        helper.make_node("Transpose", ["dw_t"], ["dw"], perm=[1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", f, [tokens, inp]), helper.make_tensor_value_info("dy", f, [tokens, out])],
        [helper.make_tensor_value_info("dw", f, [out, inp])],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", help="write the raw timings here as JSON")
    args = parser.parse_args()
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # ort_hf's kernels
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'tokens x out x in':22s} {'GFLOP':>6s} {'ORT Gemm ms':>11s} {'GFLOP/s':>8s} {'mm ms':>8s} {'GFLOP/s':>8s}")
    for tokens, out, inp in SHAPES:
        x = rng.standard_normal((tokens, inp)).astype(np.float32)
        dy = rng.standard_normal((tokens, out)).astype(np.float32)
        session = _gemm_session(tokens, out, inp, args.threads)
        tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
        feeds = {"x": x, "dy": dy}
        ort_ms = _min_ms(lambda s=session, f=feeds: s.run(None, f), args.reps)
        mm_ms = _min_ms(lambda a=tdy, b=tx: torch.ops.ort_hf.weight_grad(a, b, args.threads), args.reps)
        gflop = 2 * tokens * out * inp / 1e9
        rows.append({"tokens": tokens, "out": out, "in": inp, "gflop": gflop, "ort_gemm_ms": ort_ms, "mm_ms": mm_ms})
        print(
            f"{f'{tokens} x {out} x {inp}':22s} {gflop:6.1f} {ort_ms:11.1f} {gflop / ort_ms * 1e3:8.1f} "
            f"{mm_ms:8.1f} {gflop / mm_ms * 1e3:8.1f}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        facts = {
            "cpu": platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": args.threads,
            "reps": args.reps,
            "results": rows,
        }
        Path(args.out).write_text(json.dumps(facts, indent=1) + "\n")


if __name__ == "__main__":
    main()
