"""GPT-2's gelu_new, which ORT runs as FastGelu, trains through ORT with its gradient on ort_hf's
kernel (PyTorch's tanh gelu_backward): the same loss and gradients as the model in PyTorch."""

import copy

import torch
from tiny_models import FAMILIES, build, make_batch

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.module_with_loss import ModuleWithLoss

STRICT = ORTOptions(fallback="disable", log_level="ERROR")


def test_gpt2_trains_with_the_tanh_gelu_gradient_swapped():
    model = build(FAMILIES["gpt2-clm"])
    assert model.config.activation_function == "gelu_new"
    reference = copy.deepcopy(model)
    engine = wrap_model(ModuleWithLoss(model), STRICT)
    engine.train()
    batch = make_batch("clm", torch.Generator().manual_seed(1))
    own = reference(**batch).loss
    own.backward()
    got = engine(**batch)["loss"]
    got.backward()
    assert engine.engine_status().backend == "ort"
    torch.testing.assert_close(got.detach(), own.detach(), rtol=1e-5, atol=1e-6)
    for (name, ref), param in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(param.grad, ref.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    swapped = engine._record.swapped
    assert swapped.get("FastGeluGrad", 0) + swapped.get("BiasFastGeluGrad_dX", 0) == model.config.n_layer
    graph = engine.training_graph().graph
    assert not [n for n in graph.node if n.op_type in ("FastGeluGrad", "BiasFastGeluGrad_dX")]
    assert sum("/ort_hf_gelu_tanh_backward" in n.name for n in graph.node) == model.config.n_layer
