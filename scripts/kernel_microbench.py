"""ORT 1.19.2's CPU gradient kernels against the PyTorch (or ort_hf) kernels ort_hf runs in their
place, on the same shapes (issue 44): the evidence for the swaps of ``engine/cpu_grad_swaps.py``,
and for leaving the others (SiLU's and GatherElements' gradients) with ORT.

Each ORT kernel runs alone in an ORT session of one node (2 intra-op threads, no spinning); the
PyTorch kernel runs on one thread, as ORT's graph gives it (``ORTOptions.torch_threads_in_graph``).
Per call, after two warm-up calls: the CPU time the process used (every thread's;
``time.process_time``), which other processes on a busy machine inflate far less than the wall
clock, and the fastest wall time of the repetitions.

    python scripts/kernel_microbench.py --out docs/results/kernel-profiles/<cpu key>/microbench.json

A diagnostic, not a test: no figure is checked."""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch
from onnx import TensorProto, helper

F = TensorProto.FLOAT


def _session(op_type: str, inputs: dict[str, list[int]], outputs: list[str], types=None, **attrs):
    import onnxruntime as ort

    node = helper.make_node(op_type, list(inputs), outputs, domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [  # "": an optional input left out
            helper.make_tensor_value_info(name, (types or {}).get(name, F), shape)
            for name, shape in inputs.items()
            if name
        ],
        [helper.make_tensor_value_info(name, F, None) for name in outputs],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _time(fn, reps: int) -> dict[str, float]:
    fn()
    fn()
    walls = []
    cpu = time.process_time()
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return {"cpu_ms": (time.process_time() - cpu) / reps * 1e3, "min_wall_ms": min(walls) * 1e3}


def _cases(rng):
    def randn(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    for rows, hidden in [(2048, 256), (2048, 512), (4096, 1024)]:
        x, dy, w = randn(rows, hidden), randn(rows, hidden), randn(hidden)
        rstd = (1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)).astype(np.float32)
        feeds = {"dy": dy, "x": x, "w": w, "rstd": rstd}
        shapes = {"dy": [rows, hidden], "x": [rows, hidden], "w": [hidden], "rstd": [rows, 1]}
        t = {k: torch.tensor(v) for k, v in feeds.items()}
        yield (
            "SimplifiedLayerNormalizationGrad",
            "ort_hf::rms_norm_backward",
            [rows, hidden],
            _session("SimplifiedLayerNormalizationGrad", shapes, ["dx", "dw"], axis=-1),
            feeds,
            lambda t=t: torch.ops.ort_hf.rms_norm_backward(t["dy"], t["x"], t["w"], t["rstd"]),
        )
        mean = x.mean(-1, keepdims=True)
        feeds = {"dy": dy, "x": x, "w": w, "mean": mean, "rstd": (1 / np.sqrt(x.var(-1, keepdims=True) + 1e-12))}
        feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
        shapes = {**shapes, "mean": [rows, 1]}
        shapes = {k: shapes[k] for k in feeds}
        t = {k: torch.tensor(v) for k, v in feeds.items()}
        yield (
            "LayerNormalizationGrad",
            "aten::native_layer_norm_backward",
            [rows, hidden],
            _session("LayerNormalizationGrad", shapes, ["dx", "dw", "db"], axis=-1),
            feeds,
            lambda t=t, h=hidden: torch.ops.aten.native_layer_norm_backward(
                t["dy"], t["x"], [h], t["mean"], t["rstd"], t["w"], t["w"], [True, True, True]
            ),
        )
    for shape in [(8, 4, 256, 256), (16, 4, 128, 128), (8, 8, 512, 512)]:
        y = torch.softmax(torch.randn(shape, generator=torch.Generator().manual_seed(0)), -1)
        dy = torch.tensor(randn(*shape))
        yield (
            "SoftmaxGrad_13",
            "ort_hf::softmax_backward",
            list(shape),
            _session("SoftmaxGrad_13", {"dy": list(shape), "y": list(shape)}, ["dx"], axis=-1),
            {"dy": dy.numpy(), "y": y.numpy()},
            lambda dy=dy, y=y: torch.ops.ort_hf.softmax_backward(dy, y, -1),
        )
    # checked and left with ORT: GatherElementsGrad (DeBERTa's shapes), against scatter_add_ into zeros
    for x_shape, i_shape in [((64, 128, 512), (64, 128, 128)), ((64, 128, 256), (64, 128, 128))]:
        dy = randn(*i_shape)
        idx = rng.integers(0, x_shape[-1], i_shape).astype(np.int64)
        t_dy, t_idx = torch.tensor(dy), torch.tensor(idx)
        inputs = {"dy": list(i_shape), "shape": [3], "idx": list(i_shape)}
        yield (
            "GatherElementsGrad",
            "aten::scatter_add_ into zeros",
            [list(i_shape), list(x_shape)],
            _session(
                "GatherElementsGrad",
                inputs,
                ["dx"],
                axis=-1,
                types={"shape": TensorProto.INT64, "idx": TensorProto.INT64},
            ),
            {"dy": dy, "shape": np.array(x_shape, np.int64), "idx": idx},
            lambda t_dy=t_dy, t_idx=t_idx, s=x_shape: torch.zeros(s).scatter_add_(-1, t_idx, t_dy),
        )
    # cross-entropy's gradient over the labelled rows (MLM's after label sparsity) and over every
    # position (a causal LM's loss in the graph); ort_hf's kernel takes PyTorch's 2 threads itself
    for rows, classes in [(331, 30522), (1024, 32000)]:
        scores = torch.randn(rows, classes, generator=torch.Generator().manual_seed(0))
        log_prob, labels = torch.log_softmax(scores, -1), torch.tensor(rng.integers(0, classes, rows))
        dy, ignore = torch.tensor(1.0), torch.tensor(-100)
        yield (
            "SoftmaxCrossEntropyLossInternalGrad",
            "ort_hf::softmax_cross_entropy_grad",
            [rows, classes],
            _session(
                "SoftmaxCrossEntropyLossInternalGrad",
                {"dy": [], "log_prob": [rows, classes], "labels": [rows], "": [], "ignore": []},
                ["d_scores"],
                types={"labels": TensorProto.INT64, "ignore": TensorProto.INT64},
                reduction="mean",
            ),
            {"dy": dy.numpy(), "log_prob": log_prob.numpy(), "labels": labels.numpy(), "ignore": ignore.numpy()},
            lambda a=(dy, log_prob, labels): torch.ops.ort_hf.softmax_cross_entropy_grad(*a, None, -100, 1, 2),
        )
    # SiLU's gradient (QuickGeluGrad, alpha 1) checked and left with ORT; ReLU's swapped
    for shape in [(2048, 688), (2048, 1024)]:
        x, dy = randn(*shape), randn(*shape)
        tx, tdy = torch.tensor(x), torch.tensor(dy)
        io = {"dy": list(shape), "x": list(shape)}
        yield (
            "QuickGeluGrad",
            "aten::silu_backward",
            list(shape),
            _session("QuickGeluGrad", io, ["dx"], alpha=1.0),
            {"dy": dy, "x": x},
            lambda tdy=tdy, tx=tx: torch.ops.aten.silu_backward(tdy, tx),
        )
        yield (
            "ReluGrad",
            "ort_hf::relu_backward",
            list(shape),
            _session("ReluGrad", io, ["dx"]),
            {"dy": dy, "x": x},
            lambda tdy=tdy, tx=tx: torch.ops.ort_hf.relu_backward(tdy, tx),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--out", help="write the raw timings here as JSON")
    args = parser.parse_args()
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # ort_hf's kernels
    torch.set_num_threads(1)
    rows = []
    print(f"{'ORT kernel':34s} {'shape':22s} {'ORT cpu ms':>10s} {'swap cpu ms':>11s} {'ratio':>6s}")
    for ort_op, swap, shape, session, feeds, torch_fn in _cases(np.random.default_rng(0)):
        ort_t = _time(lambda s=session, f=feeds: s.run(None, f), args.reps)
        swap_t = _time(torch_fn, args.reps)
        rows.append({"ort_kernel": ort_op, "swap_kernel": swap, "shape": shape, "ort": ort_t, "swap": swap_t})
        ratio = ort_t["cpu_ms"] / swap_t["cpu_ms"]
        print(f"{ort_op:34s} {str(shape):22s} {ort_t['cpu_ms']:10.2f} {swap_t['cpu_ms']:11.2f} {ratio:6.1f}x")
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        facts = {
            "cpu": platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "reps": args.reps,
            "ort_threads": 2,
            "torch_threads": 1,
            "results": rows,
        }
        Path(args.out).write_text(json.dumps(facts, indent=1) + "\n")


if __name__ == "__main__":
    main()
