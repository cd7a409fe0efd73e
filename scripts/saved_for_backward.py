"""What each engine keeps from a causal LM's forward for its backward, by producing op and shape: the
memory a training step holds at the end of its forward, above the weights (issue 44's peak on the
SmolLM2-135M shape).

- eager: every tensor autograd saves in one forward of the model with its own loss
  (``torch.autograd.graph.saved_tensors_hooks``), each storage once, the parameters left out.
- ORT: one ``ORTTrainer`` step (ort_hf's defaults, fused loss included where it applies), then the
  training graph as ORT's session runs it: the graph ORT built is handed to a session with ORTModule's
  options again, that session's own optimisations applied and written out, since they fuse and drop
  nodes (a weight's ``Transpose`` before its ``MatMul``s, for one). A stashed value is one computed
  before the ``YieldOp`` (the forward) and read after it (the backward); its size is the graph's
  shape with the batch's dimensions. The fused loss's gradients, held by its PythonOp's context, are
  not values of the graph and not counted.

    python scripts/saved_for_backward.py --model_dir /tmp/heldout/smollm-30x576-v49k \\
        --batch_size 4 --seq_len 256 --out docs/results/saved-for-backward/<cpu key>/smollm-30x576-v49k.json

A diagnostic, not a test: one process, random token ids, no figure checked."""

from __future__ import annotations

import argparse
import collections
import gc
import json
import tempfile
from pathlib import Path

import torch

WIDTH = {1: 4, 2: 1, 3: 1, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 16: 2}  # ONNX element type -> bytes


def _table(sizes: collections.Counter, counts: collections.Counter) -> list[dict]:
    return [
        {"producer": key[0], "shape": list(key[1]), "tensors": counts[key], "MB": round(size / 2**20, 1)}
        for key, size in sizes.most_common()
    ]


def eager_saved(model, ids: torch.Tensor) -> list[dict]:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    sizes, counts = collections.Counter(), collections.Counter()

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            key = (type(t.grad_fn).__name__ if t.grad_fn is not None else "input", tuple(t.shape))
            sizes[key] += storage.nbytes()
            counts[key] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return _table(sizes, counts)


def _session_graph(manager, path: Path):
    import onnx
    import onnxruntime

    options, providers, provider_options = manager._get_session_config()
    options.optimized_model_filepath = str(path)
    model = manager._onnx_models.optimized_model
    onnxruntime.InferenceSession(model.SerializeToString(), options, providers, provider_options)
    return onnx.load(str(path), load_external_data=False).graph


def ort_stashed(graph, dims: dict[str, int]) -> list[dict]:
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    yields = [i for i, node in enumerate(graph.node) if node.op_type == "YieldOp"]
    forward, todo = set(), list(yields)
    while todo:
        i = todo.pop()
        if i not in forward:
            forward.add(i)
            todo += [producer[x] for x in graph.node[i].input if x in producer]
    types = {v.name: v.type.tensor_type for v in (*graph.value_info, *graph.output, *graph.input)}
    sizes, counts, seen = collections.Counter(), collections.Counter(), set()
    for i, node in enumerate(graph.node):
        if i in forward:
            continue
        for name in node.input:
            source = producer.get(name)
            if source not in forward or graph.node[source].op_type == "YieldOp" or name in seen:
                continue
            seen.add(name)
            t = types.get(name)
            shape = tuple(d.dim_value or dims.get(d.dim_param, d.dim_param) for d in t.shape.dim) if t else ("?",)
            elements = 1
            for d in shape:
                elements *= d if isinstance(d, int) else 0
            key = (graph.node[source].op_type, shape)
            sizes[key] += elements * WIDTH.get(t.elem_type if t else 1, 4)
            counts[key] += 1
    return _table(sizes, counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from ort_hf import ORTTrainer, ORTTrainingArguments
    from ort_hf.engine.wrap import ORTTrainingModule

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir).train()
    ids = torch.randint(0, model.config.vocab_size, (args.batch_size, args.seq_len))
    eager = eager_saved(model, ids)
    rows = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    with tempfile.TemporaryDirectory() as out:
        training = ORTTrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch_size, max_steps=1, use_ort=True,
            report_to=[], save_strategy="no", use_cpu=True, ort_fallback="disable",
        )  # fmt: skip
        ORTTrainer(model=model, args=training, train_dataset=rows).train()
        wrapped = next(o for o in gc.get_objects() if isinstance(o, ORTTrainingModule))
        graph = _session_graph(wrapped._training_manager(), Path(out) / "session.onnx")
    dims = {"input_ids_dim0": args.batch_size, "input_ids_dim1": args.seq_len}
    ort = ort_stashed(graph, dims)
    result = {
        "model_dir": args.model_dir,
        "batch": [args.batch_size, args.seq_len],
        "eager_MB": round(sum(r["MB"] for r in eager), 1),
        "ort_MB": round(sum(r["MB"] for r in ort), 1),
        "eager": eager,
        "ort": ort,
    }
    for engine in ("eager", "ort"):
        print(f"{engine}: {result[engine + '_MB']} MB")
        for r in result[engine][:12]:
            print(f"  {r['MB']:8.1f} MB  {r['tensors']:3d} x {r['producer']} {r['shape']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
