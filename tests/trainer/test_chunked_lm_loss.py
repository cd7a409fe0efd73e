"""The causal LM's head and cross-entropy fused, in row chunks, inside the ORT graph (dense labels):
the same loss and gradients as the model's own, and ORT ran it as a PythonOp."""

import copy
import logging
import warnings

import pytest
import torch
from tiny_models import FAMILIES, build, id_dataset, make_batch, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.engine import HeadProducts, ORTOptions, cpu_head_products, wrap_model
from ort_hf.engine import proven as proven_module
from ort_hf.module_with_loss import ModuleWithLoss, chunked_lm_loss
from ort_hf.module_with_loss.chunked_head import fused_in_graph
from ort_hf.module_with_loss.chunked_lm_loss import chunked_linear_cross_entropy
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

STRICT = ORTOptions(fallback="disable", log_level="ERROR")


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 3 rows at the tiny vocabulary (100): several per batch, the last one partial."""
    monkeypatch.setattr(chunked_lm_loss, "CHUNK_ELEMENTS", 300)


ON_ORT = {  # the products on the engine's ORT sessions: (forward, input_grad, weight_grad)
    None: (False, False, False),
    "ort-forward": (True, False, False),
    "ort-input-grad": (False, True, False),
    "ort-weight-grad": (False, False, True),
    "ort-all": (True, True, True),
}


@pytest.mark.parametrize("product", list(ON_ORT), ids=["mm", *list(ON_ORT)[1:]])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_loss_and_gradients_equal_linear_then_cross_entropy(small_chunks, monkeypatch, with_bias, product):
    """The products on PyTorch's mm, or on the engine's ORT sessions: the forward (no bias), the
    hidden states' gradient, the weight's (summed over seven chunks in place), or all three."""
    forward, input_grad, weight_grad = ON_ORT[product]
    ort_product = HeadProducts(threads=2, forward=forward, input_grad=input_grad, weight_grad=weight_grad)
    monkeypatch.setitem(chunked_lm_loss.PRODUCTS, product, ort_product)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(20, 8, generator=g, requires_grad=True)
    weight = torch.randn(100, 8, generator=g, requires_grad=True)
    bias = torch.randn(100, generator=g, requires_grad=True) if with_bias else None
    labels = torch.randint(0, 100, (20,), generator=g)
    labels[[0, 7, 19]] = -100
    results = []
    for fused in (False, True):
        if fused:
            loss = chunked_linear_cross_entropy(hidden, weight, bias, labels, -100, product=product)
        else:
            logits = torch.nn.functional.linear(hidden, weight, bias)
            loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
        (loss * 0.3).backward()  # the backward scales by the incoming gradient
        params = [p for p in (hidden, weight, bias) if p is not None]
        results.append((loss.detach(), *(p.grad.clone() for p in params)))
        for p in params:
            p.grad = None
    for ref, got in zip(*results):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert results[1][1][[0, 7, 19]].abs().max() == 0  # ignored rows get no gradient
    ran = {key[0] for key in ort_product._sessions}  # the products ORT's sessions ran
    expected = (
        ({"forward"} if forward and not with_bias else set())
        | ({"input_grad"} if input_grad else set())
        | ({"weight_grad", "weight_grad_add"} if weight_grad else set())
    )
    assert ran == expected


def _fused_and_reference(hidden, weight, labels):
    out = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            loss = chunked_linear_cross_entropy(h, w, None, labels, -100)
        else:
            loss = torch.nn.functional.cross_entropy(h @ w.t(), labels, ignore_index=-100, reduction="sum")
        loss.backward()
        out.append((loss.detach(), h.grad, w.grad))
    return out


def test_the_chunk_buffer_is_kept_between_calls_and_carries_nothing_over(small_chunks):
    """The second call reuses the first's buffer (no fresh pages), and computes its own inputs' loss:
    here logits 60 apart, where every probability but the top one underflows, then no rows at all."""
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 100, (20,), generator=g)
    labels[5] = -100
    calls = [
        (torch.randn(20, 8, generator=g), torch.randn(100, 8, generator=g)),
        (torch.randn(20, 8, generator=g) * 30, torch.randn(100, 8, generator=g)),
    ]
    kept = []
    for hidden, weight in calls:
        ref, got = _fused_and_reference(hidden, weight, labels)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert chunked_lm_loss._spare is not None
        kept.append(chunked_lm_loss._spare.data_ptr())
    assert kept[0] == kept[1]
    ref, got = _fused_and_reference(torch.zeros(0, 8), torch.randn(100, 8, generator=g), labels[:0])
    assert float(got[0]) == 0 and got[2].abs().max() == 0 and got[1].shape == (0, 8)
    chunked_lm_loss.release_spare_buffer()
    assert chunked_lm_loss._spare is None


def test_a_label_whose_softmax_underflows_gets_its_loss_from_its_logits(small_chunks):
    """Logits 200 apart: the softmax at the label is 0 in float32 (a loss of about 200, where -log of
    it would be inf), and 87 apart, just above the smallest normal float; the first row's loss is
    recomputed from its logits, the others' read off the softmax."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(7, 8, generator=g)
    hidden[2] = 0
    hidden[2, 0] = 100.0
    hidden[4] = 0
    hidden[4, 0] = 43.5  # softmax at the label exp(-87), just above float32's smallest normal
    weight = torch.randn(100, 8, generator=g)
    weight[:, 0] = 0
    weight[10, 0], weight[11, 0] = 1.0, -1.0
    labels = torch.randint(0, 100, (7,), generator=g)
    labels[2], labels[4], labels[6] = 11, 11, -100
    ref, got = _fused_and_reference(hidden, weight, labels)
    assert torch.isfinite(got[0]) and float(ref[0]) > 200
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_second_backward_raises_instead_of_reading_gradients_scaled_in_place():
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(7, 4, requires_grad=True)
    loss = chunked_linear_cross_entropy(hidden, weight, None, torch.randint(0, 7, (5,)), -100) * 0.5
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("family", ["gpt2-clm", "llama-clm"])
def test_in_ort_the_loss_and_gradients_are_the_models_own(small_chunks, family):
    """GPT-2 (tied embeddings, Conv1D, gelu_new) and Llama (SwiGLU, untied head); -100 on padding."""
    model = build(FAMILIES[family])
    assert model.config.tie_word_embeddings == (family == "gpt2-clm")
    reference = copy.deepcopy(model)
    module = ModuleWithLoss(model)
    module.chunked_head = True
    engine = wrap_model(module, STRICT)
    engine.train()
    batches = [make_batch("clm", torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    for batch in batches:
        assert (batch["labels"] == -100).any()
        items = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()) + 5)  # a larger accumulated count
        own = reference(**batch, num_items_in_batch=items).loss
        own.backward()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = engine(**batch, num_items_in_batch=items)["loss"]  # the first exports: the trace runs
        # the fused Function's body is one PythonOp, not traced: the tracer's warnings about it are noise
        assert not [w for w in caught if w.category is torch.jit.TracerWarning and "chunked_lm" in w.filename]
        got.backward()
        torch.testing.assert_close(got.detach(), own.detach(), rtol=1e-5, atol=1e-6)
        for (name, ref), param in zip(reference.named_parameters(), model.parameters()):
            torch.testing.assert_close(param.grad, ref.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert engine.engine_status().backend == "ort"
    assert fused_in_graph(engine.training_graph())


SEQ, ROWS = 32, 32


def _dense_dataset():
    """Causal-LM rows with a few ignored labels (2%, and the shift ignores 1 of 32: dense, above label
    sparsity's 90% threshold)."""
    return id_dataset(ROWS, SEQ, lambda ids, g: ids.masked_fill(torch.rand(ids.shape, generator=g) < 0.02, -100))


def _train(cls_trainer, cls_args, out, family, **kw):
    args = dict(
        max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-2, optim="sgd"
    )  # SGD: the weights move by lr x the gradients, so they compare the gradients
    args.update(kw)
    model = build(FAMILIES[family])
    trainer = cls_trainer(model=model, args=tiny_args(cls_args, out, **args), train_dataset=_dense_dataset())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["gpt2-clm", pytest.param("llama-clm", marks=pytest.mark.slow)])
def test_trainer_with_accumulation_trains_the_models_own_loss(small_chunks, tmp_path, family):
    _, ref_losses, ref_params = _train(Trainer, TrainingArguments, tmp_path / "pt", family)
    trainer, losses, params = _train(
        ORTTrainer,
        ORTTrainingArguments,
        tmp_path / "ort",
        family,
        ort_chunked_lm_loss=True,
        ort_cpu_lm_head_forward_swap=True,  # the default on AMD CPUs only (cpu_head_products.py)
        ort_cpu_lm_head_input_grad_swap=True,  # the default on AMD CPUs with AVX512 only
        ort_cpu_lm_head_weight_grad_swap=True,  # the default on those of family 26 only
    )
    assert trainer.ort_engine_status().backend == "ort"
    logged = next(h for h in trainer.state.log_history if "ort/chunked_lm_loss" in h)
    assert logged["ort/chunked_lm_loss"] == 1.0 and logged["ort/loss_in_graph"] == 1.0
    assert fused_in_graph(trainer.ort_engine.training_graph())
    assert trainer.ort_engine.label_sparsity_fired() is False
    head_product = chunked_lm_loss.PRODUCTS[trainer.ort_engine.module.head_product]
    ran = {key[0] for key in head_product._sessions}  # the chunks' products ran on ORT's MatMul and Gemm
    assert ran == {"forward", "input_grad", "weight_grad", "weight_grad_add"}
    assert len(losses) == 4 and max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-5
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize(
    "vendor, capability, family",
    [
        ("AuthenticAMD", "AVX512", 26),
        ("AuthenticAMD", "AVX512", 25),
        ("AuthenticAMD", "AVX2", 25),
        ("GenuineIntel", "AVX512", 6),
    ],
)
def test_the_heads_products_are_ort_s_by_default_where_measured_faster(
    small_chunks, monkeypatch, tmp_path, vendor, capability, family
):
    """Where each was measured faster (cpu_head_products.py): the forward product on ORT's MatMul on
    AMD CPUs, the hidden states' gradient on ORT's MatMul on AMD CPUs with AVX512, the weight's on
    ORT's Gemm on those of family 26; PyTorch's mm on the others."""
    monkeypatch.setattr(cpu_head_products, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(cpu_head_products, "cpu_family", lambda: family)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    trainer, _, _ = _train(
        ORTTrainer, ORTTrainingArguments, tmp_path, "gpt2-clm", max_steps=1, ort_chunked_lm_loss=True
    )
    assert fused_in_graph(trainer.ort_engine.training_graph())
    product = trainer.ort_engine.module.head_product
    ran = {key[0] for key in chunked_lm_loss.PRODUCTS[product]._sessions} if product else set()
    expected = {"forward"} if vendor == "AuthenticAMD" else set()  # else on mm
    if (vendor, capability) == ("AuthenticAMD", "AVX512"):
        expected |= {"input_grad"}
        if family == 26:
            expected |= {"weight_grad", "weight_grad_add"}
    assert ran == expected
    assert cpu_head_products.ort_product_wanted(True, vendor="GenuineIntel")  # the options override
    assert not cpu_head_products.ort_product_wanted(False, vendor="AuthenticAMD")
    assert cpu_head_products.ort_input_grad_wanted(True, vendor="GenuineIntel", capability="AVX512")
    assert not cpu_head_products.ort_input_grad_wanted(False, vendor="AuthenticAMD", capability="AVX512")
    assert cpu_head_products.ort_weight_grad_wanted(True, vendor="GenuineIntel", capability="AVX512", family=6)
    assert not cpu_head_products.ort_weight_grad_wanted(False, vendor="AuthenticAMD", capability="AVX512", family=26)


def _fused_loss_proven_for(monkeypatch, names: set[str]) -> None:
    """The sweep's lists with only ``names`` proven for the fused loss."""
    lists = {key: frozenset() for key in ("exact", "trim_padding", "eliminate_padding")}
    monkeypatch.setattr(proven_module, "_proven", lambda: {**lists, "chunked_lm_loss": frozenset(names)})


@pytest.mark.parametrize("proven", [True, False], ids=["proven", "not-proven"])
def test_by_default_it_runs_only_for_classes_the_sweep_proved(tmp_path, monkeypatch, caplog, proven):
    _fused_loss_proven_for(monkeypatch, {"GPT2LMHeadModel"} if proven else set())
    with caplog.at_level(logging.INFO, logger="ort_hf"):
        trainer, _, _ = _train(ORTTrainer, ORTTrainingArguments, tmp_path, "gpt2-clm", max_steps=1)
    logged = next(h for h in trainer.state.log_history if "ort/chunked_lm_loss" in h)
    assert trainer.ort_engine_status().backend == "ort"
    assert logged["ort/chunked_lm_loss"] == logged["ort/loss_in_graph"] == float(proven)
    assert fused_in_graph(trainer.ort_engine.training_graph()) is proven
    if not proven:  # the log says why, and how to turn it on
        assert "has not proven it exact for GPT2LMHeadModel (--ort_chunked_lm_loss true" in caplog.text


def test_false_keeps_the_loss_in_pytorch_for_a_proven_class(tmp_path, monkeypatch):
    _fused_loss_proven_for(monkeypatch, {"GPT2LMHeadModel"})
    trainer, _, _ = _train(
        ORTTrainer, ORTTrainingArguments, tmp_path, "gpt2-clm", max_steps=1, ort_chunked_lm_loss=False
    )
    logged = next(h for h in trainer.state.log_history if "ort/chunked_lm_loss" in h)
    assert logged["ort/chunked_lm_loss"] == 0.0 and logged["ort/loss_in_graph"] == 0.0
    assert not fused_in_graph(trainer.ort_engine.training_graph())


def test_a_head_over_resized_hidden_states_is_refused_not_crashed():
    """ELECTRA's generator resizes the backbone's hidden states (64) to its embedding size (32)
    before its head: the check on the first batch refuses the fused loss instead of raising."""
    from transformers import ElectraConfig, ElectraForCausalLM

    from ort_hf.module_with_loss.chunked_head import chunked_head_refusal
    from ort_hf.module_with_loss.loss_choice import choose_loss

    config = ElectraConfig(
        vocab_size=100, embedding_size=32, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, is_decoder=True,
    )  # fmt: skip
    model = ElectraForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    module = ModuleWithLoss(model)
    module.use(choose_loss(module, batch, None))
    assert "logits are not its head's projection" in chunked_head_refusal(module, batch, True)
