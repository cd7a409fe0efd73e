"""Frozen parameters (a frozen embedding, a frozen encoder layer) get no gradient in ORT's graph;
a parameter unfrozen mid-run starts training, as in PyTorch. LoRA: tests/trainer/test_lora.py."""

import copy

import torch
from parity import STRICT, assert_parity, graph_gradients, run_parity, trainable
from tiny_models import FAMILIES, build, make_batch

from ort_hf.engine import wrap_model


def _bert_partly_frozen():
    model = build(FAMILIES["bert-cls"])
    model.bert.embeddings.requires_grad_(False)
    model.bert.encoder.layer[0].requires_grad_(False)
    return model


def test_frozen_embedding_and_encoder_layer_have_no_gradient_in_the_graph():
    gen = torch.Generator().manual_seed(0)
    model = _bert_partly_frozen()
    result = run_parity(model, [make_batch("cls", gen) for _ in range(3)])
    assert_parity(*result)
    wrapped = result[-1]
    assert graph_gradients(wrapped) == trainable(model)
    assert not any(name.startswith(("bert.embeddings.", "bert.encoder.layer.0.")) for name in graph_gradients(wrapped))


def test_unfreezing_mid_run_rebuilds_the_gradient_graph_without_re_exporting():
    gen = torch.Generator().manual_seed(1)
    batches = [make_batch("cls", gen) for _ in range(3)]
    model = _bert_partly_frozen()
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, STRICT)
    wrapped.train()
    runs = {}
    for name, net, params in (("torch", reference, reference), ("ort", wrapped, model)):
        opt = torch.optim.SGD(params.parameters(), lr=0.1)  # holds the frozen ones too: they train once unfrozen
        losses = []
        for step, batch in enumerate(batches):
            if step == 1:
                params.bert.embeddings.requires_grad_(True)
            loss = net(**batch).loss
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
        runs[name] = losses
    assert wrapped.engine_status().backend == "ort"
    assert max(abs(a - b) for a, b in zip(runs["torch"], runs["ort"])) <= 1e-4
    for name, value in model.state_dict().items():
        torch.testing.assert_close(
            value, reference.state_dict()[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}"
        )
    initial = build(FAMILIES["bert-cls"]).bert.embeddings.word_embeddings.weight
    assert not torch.equal(model.bert.embeddings.word_embeddings.weight, initial)  # trained once unfrozen
    assert graph_gradients(wrapped) == trainable(model)
    assert any(name.startswith("bert.embeddings.") for name in graph_gradients(wrapped))
    assert wrapped.engine_status().export_count == 1  # the graph was rebuilt, the model not exported again
