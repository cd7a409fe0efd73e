"""The pre-flight: a model the sweep has not proven is checked against PyTorch before its first step,
and one whose graph computes something else, or holds the first batch's length, is refused then."""

import logging

import pytest
import torch
from tiny_models import FAMILIES, build, make_batch

from ort_hf.engine import ORTFallbackError, ORTOptions, wrap_model
from ort_hf.engine.proven import model_class_name, padding_rewrite_proven, proven_exact

CHECKED = ORTOptions(fallback="disable", log_level="ERROR", preflight="always")


class BakedLength(torch.nn.Module):
    """A mean over tokens whose divisor is the traced batch's length, a Python int: the exported
    graph keeps the first batch's length as a constant and is wrong at any other."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask, labels):
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        pooled = hidden.sum(dim=1) / int(input_ids.shape[1])
        return {"loss": torch.nn.functional.cross_entropy(self.head(pooled), labels)}


class BakedRows(BakedLength):
    """A loss averaged over the traced batch's number of rows, a Python int."""

    def forward(self, input_ids, attention_mask, labels):
        hidden = (self.embed(input_ids) * attention_mask.unsqueeze(-1)).mean(dim=1)
        losses = torch.nn.functional.cross_entropy(self.head(hidden), labels, reduction="none")
        return {"loss": losses.sum() / int(input_ids.shape[0])}


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (4, 10), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 1, 0])}


@pytest.mark.parametrize("module", [BakedLength, BakedRows])
def test_baked_length_is_refused_before_training(module):
    torch.manual_seed(0)
    model = module()
    before = [p.detach().clone() for p in model.parameters()]
    wrapped = wrap_model(model, CHECKED)
    wrapped.train()
    with pytest.raises(ORTFallbackError, match="(baked into it|holds a size of it) as a constant"):
        wrapped(**_batch())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_refusal_with_fallback_auto_trains_in_pytorch_and_says_why(caplog):
    torch.manual_seed(0)
    model = BakedLength()
    wrapped = wrap_model(model, ORTOptions(log_level="ERROR", preflight="always"))
    wrapped.train()
    batch = _batch()
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        loss = wrapped(**batch)["loss"]
    assert torch.allclose(loss, model(**batch)["loss"])
    status = wrapped.engine_status()
    assert status.backend == "pytorch" and "pre-flight" in status.fallback_reason
    assert any("training continues in PyTorch" in r.getMessage() for r in caplog.records)


def test_preflight_passes_leaves_no_trace_and_training_matches():
    family = FAMILIES["bert-cls"]
    model = build(family, dropout=0.1)
    g = torch.Generator().manual_seed(0)
    batch = make_batch(family.task, g)
    reference = build(family, dropout=0.1)
    wrapped = wrap_model(model, CHECKED)
    wrapped.train()
    torch.manual_seed(1)
    state = torch.random.get_rng_state()
    wrapped(**batch).loss.backward()
    # The check restores torch's RNG: the step after it drew the same numbers as without it.
    torch.manual_seed(1)
    assert torch.equal(state, torch.random.get_rng_state())
    assert wrapped.engine_status().backend == "ort"
    # Dropout rates are back (the check turned them off for its own session only).
    rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert rates and all(p == 0.1 for p in rates)
    assert reference.config.hidden_dropout_prob == model.config.hidden_dropout_prob == 0.1
    # Gradients are one step's, not the check's added in.
    one = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert one and all(torch.isfinite(g).all() for g in one.values())


def test_model_class_is_read_through_wrappers_and_unproven_defaults_are_off():
    from ort_hf.engine.runtime import ensure_engine
    from ort_hf.engine.wrap_settings import WrapSettings
    from ort_hf.module_with_loss import ModuleWithLoss

    model = build(FAMILIES["bert-cls"])
    wrapper = ModuleWithLoss(model)
    assert model_class_name(wrapper) == "BertForSequenceClassification"

    class Mine(torch.nn.Module):
        def forward(self, x):
            return x

    mine = Mine()
    assert not proven_exact(mine) and not any(
        padding_rewrite_proven(mine, r) for r in ("trim_padding", "eliminate_padding")
    )
    settings = WrapSettings.of(mine, ORTOptions(), ensure_engine())
    assert settings.preflight and not settings.trim_padding and not settings.eliminate_padding
    forced = WrapSettings.of(
        mine, ORTOptions(trim_padding=True, eliminate_padding=True, preflight="never"), ensure_engine()
    )
    assert not forced.preflight and forced.trim_padding and forced.eliminate_padding


@pytest.mark.parametrize("fallback", ["disable", "auto"])
def test_layer_drop_is_refused_before_its_trace_fixes_the_skipped_layers(fallback, caplog):
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    from ort_hf.engine import ORTFallbackError, ORTOptions, wrap_model

    config = M2M100Config(
        vocab_size=64,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        encoder_layerdrop=0.5,
        decoder_layerdrop=0.0,
        dropout=0.0,
    )
    wrapped = wrap_model(M2M100ForConditionalGeneration(config), ORTOptions(fallback=fallback, log_level="ERROR"))
    wrapped.train()
    ids = torch.randint(4, 64, (2, 6))
    if fallback == "disable":
        with pytest.raises(ORTFallbackError, match="encoder_layerdrop"):
            wrapped(input_ids=ids, labels=ids)
    else:
        wrapped(input_ids=ids, labels=ids).loss.backward()  # PyTorch trains it, after one warning
        status = wrapped.engine_status()
        assert status.backend == "pytorch" and "LayerDrop" in status.fallback_reason and status.export_count == 0
