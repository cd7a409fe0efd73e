"""Train the same model in PyTorch and through ORT from the same seed and compare."""

from __future__ import annotations

import copy
import json
import math

import torch

from ort_hf.engine import ORTOptions, wrap_model

STRICT = ORTOptions(fallback="disable", log_level="ERROR")
# For tests that count what the engine's own export does (forwards, exports, warnings): without the
# pre-flight's session, which exports the model once more for a class the sweep has not proven.
UNCHECKED = ORTOptions(fallback="disable", log_level="ERROR", preflight="never")


def run_parity(model: torch.nn.Module, batches: list[dict], options: ORTOptions = STRICT, lr: float = 1e-3):
    """Return (torch losses, ort losses, step-1 grads torch, step-1 grads ort, wrapped)."""
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, options)
    wrapped.train()
    results = []
    for net, params_of in ((reference, reference), (wrapped, model)):
        opt = torch.optim.AdamW(params_of.parameters(), lr=lr)
        losses, first_grads = [], None
        for step, batch in enumerate(batches):
            loss = net(**batch).loss
            loss.backward()
            if step == 0:
                first_grads = {n: (None if p.grad is None else p.grad.clone()) for n, p in params_of.named_parameters()}
            losses.append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
        results.append((losses, first_grads))
    (ref_losses, ref_grads), (ort_losses, ort_grads) = results
    return ref_losses, ort_losses, ref_grads, ort_grads, wrapped


def assert_parity(ref_losses, ort_losses, ref_grads, ort_grads, wrapped, loss_atol=1e-4):
    status = wrapped.engine_status()
    assert status.backend == "ort", f"ORT did not execute: {status}"
    assert all(math.isfinite(x) for x in ort_losses)
    diffs = [abs(a - b) for a, b in zip(ref_losses, ort_losses)]
    assert max(diffs) <= loss_atol, f"loss diverged: max diff {max(diffs):.2e} at step {diffs.index(max(diffs)) + 1}"
    for name, ref in ref_grads.items():
        got = ort_grads[name]
        if ref is None:
            assert got is None or not got.any(), f"{name}: ORT produced a gradient PyTorch did not"
            continue
        assert got is not None, f"{name}: no gradient from ORT"
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")


def memcpy_nodes(onnx_dir) -> list[str]:
    """The Memcpy nodes ORT inserted into the execution graphs it saved in ``onnx_dir`` (a run with
    ``ORTOptions(save_onnx=True, onnx_dir=...)``). On CUDA each one moves a tensor between the CUDA
    and CPU providers: a node of the data path placed on the CPU. (ORT's deliberate CPU nodes, shape
    arithmetic, read CPU-side values and need none.) The saved ONNX does not record placements;
    these nodes are what shows them."""
    from pathlib import Path

    import onnx

    paths = sorted(Path(onnx_dir).glob("*_execution_model_*.onnx"))
    assert paths, f"ORT saved no execution model in {onnx_dir}"
    found = []
    for path in paths:
        graphs = [onnx.load(str(path), load_external_data=False).graph]
        while graphs:
            graph = graphs.pop()
            for node in graph.node:
                if node.op_type.startswith("Memcpy"):
                    found.append(f"{path.name}: {node.op_type} {node.name} ({', '.join(node.input)})")
                graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
                graphs.extend(g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs)
    return found


MEMCPY_PROPERTY = "memcpy_nodes"  # the test's JUnit property: a JSON list, rendered by scripts/gpu_report.py


def record_memcpy_nodes(onnx_dir, record_property) -> list[str]:
    """Record :func:`memcpy_nodes` of the run saved in ``onnx_dir`` as the test's JUnit property
    (pytest's ``record_property``), for ``make test-gpu``'s report to list per test, and return
    them. Recorded, not asserted: one misplaced node would otherwise fail every CUDA test alike."""
    found = memcpy_nodes(onnx_dir)
    record_property(MEMCPY_PROPERTY, json.dumps(found))
    return found


def graph_gradients(wrapped) -> set[str]:
    """Names (as in ``wrapped.module.named_parameters()``) of the parameters whose gradient ORT's
    training graph computes: its ``<name>_grad`` outputs."""
    outputs = [o.name for o in wrapped.training_graph().graph.output]
    assert all(name.endswith("_grad") for name in outputs), outputs  # the training graph outputs gradients only
    return {name.removesuffix("_grad").removeprefix("_original_module.") for name in outputs}


def trainable(model: torch.nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}
