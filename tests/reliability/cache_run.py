"""Run by test_export_cache: a few ORT steps with an export cache dir, reported as JSON on stdout."""

import json
import sys
import warnings

import torch

from ort_hf.engine import ORTOptions, wrap_model


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _PythonOpNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, input_ids, attention_mask, labels):
        x = torch.nn.functional.one_hot(input_ids % 8, 8).float().mean(1)
        return torch.nn.functional.mse_loss(_Square.apply(self.linear(x)).squeeze(-1), labels.float())


def _local_function_net() -> torch.nn.Module:
    class Cube(torch.autograd.Function):  # not importable by name: a fresh process cannot find it
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 3 * x * x * grad

    class Net(_PythonOpNet):
        def forward(self, input_ids, attention_mask, labels):
            x = torch.nn.functional.one_hot(input_ids % 8, 8).float().mean(1)
            return torch.nn.functional.mse_loss(Cube.apply(self.linear(x)).squeeze(-1), labels.float())

    return Net()


def _causal_lm(kind: str) -> torch.nn.Module:
    """A tiny Llama in ModuleWithLoss, as ORTTrainer places its loss on sparse labels ("sparse-lm":
    ORT's label flag in the graph; "undeclared-lm": the flag, not declared) or dense ones with the
    fused chunked head ("chunked-lm": ort_hf's PythonOp, a missing bias passed by address)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ort_hf.module_with_loss import ModuleWithLoss

    config = LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    module = ModuleWithLoss(LlamaForCausalLM(config))
    module.sparse_first_labels = kind == "sparse-lm"
    module.first_label_density = 0.5
    module.chunked_head = kind == "chunked-lm"
    return module


def _model(kind: str) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    if kind == "python-op":
        return _PythonOpNet()
    if kind == "local-python-op":
        return _local_function_net()
    if kind.endswith("-lm"):
        return _causal_lm(kind)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation=kind,
    )
    return BertForSequenceClassification(config)


def _count_structure_passes(counter: list) -> None:
    """Count ORT's output-structure passes (the PyTorch forward run to learn the outputs' structure)."""
    from onnxruntime.training.ortmodule import _io

    original = _io.parse_outputs_for_onnx_export_and_extract_schema

    def counted(*args, **kwargs):
        counter.append(1)
        return original(*args, **kwargs)

    _io.parse_outputs_for_onnx_export_and_extract_schema = counted


def _count_shape_inferences(counter: list) -> None:
    """Count the runs of ORT's symbolic shape inference over the exported graph."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager._infer_shapes

    def counted(model):
        counter.append(1)
        return original(model)

    GraphTransitionManager._infer_shapes = staticmethod(counted)


def main(cache_dir: str, kind: str, options: str = "{}") -> None:
    model = _model(kind)
    settings = {"fallback": "disable", "log_level": "ERROR", "export_cache_dir": cache_dir, **json.loads(options)}
    wrapped = wrap_model(model, ORTOptions(**settings))
    passes: list = []
    _count_structure_passes(passes)  # after wrap_model: ORT is imported, ort_hf's bridges in place
    inferences: list = []
    _count_shape_inferences(inferences)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    losses, grads = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            ids = torch.randint(3, 100, (4, 12), generator=gen)
            labels = ids.masked_fill(torch.arange(12) >= 6, -100) if kind.endswith("-lm") else ids[:, 0] % 2
            out = wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
            loss = out if isinstance(out, torch.Tensor) else out["loss"]
            loss.backward()
            grads.append([p.grad.flatten().tolist() for p in model.parameters() if p.grad is not None])
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    status = wrapped.engine_status()
    print(
        json.dumps(
            {
                "losses": losses,
                "grads": grads,
                "out_type": type(out).__name__,
                "backend": status.backend,
                "export_count": status.export_count,
                "structure_passes": len(passes),
                "shape_inferences": len(inferences),
                # ORT's C++ builder built the training graph (not a stand-in returning the kept one).
                "gradient_built": type(wrapped._training_manager()._graph_builder).__name__ == "OrtModuleGraphBuilder",
                # The session optimised the training graph itself (not loaded it optimised, optimisers off).
                "session_optimised": wrapped._session().get_session_options().graph_optimization_level.name
                != "ORT_DISABLE_ALL",
                "label_sparsity": bool(wrapped.label_sparsity_fired()),
                # A classifier's first forward sets it; a hit runs no forward (the entry keeps it).
                "problem_type": getattr(getattr(model, "config", None), "problem_type", None),
                "python_ops": sum(n.op_type == "PythonOp" for n in wrapped.training_graph().graph.node),
                # What ORT's banner reports as label sparsity (module: density), from its runtime inspector.
                "label_flags_noted": wrapped._training_manager()._runtime_inspector._sceloss_module_to_ignore_density_map,
                "warnings": [str(w.message) for w in caught if "ort_hf" in str(w.message)],
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
