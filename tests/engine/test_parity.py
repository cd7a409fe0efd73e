"""Training through wrap_model matches plain PyTorch for each supported family."""

import math

import pytest
import torch
from parity import STRICT, assert_parity, run_parity
from tiny_models import EXTRA_FAMILIES, FAMILIES, build, make_batch

from ort_hf.engine import wrap_model

CASES = [(name, attn) for name, fam in FAMILIES.items() for attn in ("eager", "sdpa") if attn == "eager" or fam.sdpa]


@pytest.mark.parametrize("family,attn", CASES)
def test_twenty_steps_match_pytorch(family, attn):
    fam = FAMILIES[family]
    gen = torch.Generator().manual_seed(1)
    batches = [make_batch(fam.task, gen) for _ in range(20)]
    assert_parity(*run_parity(build(fam, attn=attn), batches))


@pytest.mark.parametrize("family", ["bert-cls", "gpt2-clm", "llama-clm"])
def test_no_attention_mask_matches_pytorch(family):
    # transformers 5 then detects packed sequences with aten::diff / cumsum on bool.
    fam = FAMILIES[family]
    gen = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(5):
        batch = make_batch(fam.task, gen, padded=False)
        del batch["attention_mask"]
        batches.append(batch)
    assert_parity(*run_parity(build(fam, attn="sdpa"), batches))


@pytest.mark.parametrize("family", [n for n, f in FAMILIES.items() if f.sdpa])
def test_sdpa_with_dropout_trains(family):
    fam = FAMILIES[family]
    model = build(fam, dropout=0.1, attn="sdpa")
    wrapped = wrap_model(model, STRICT)
    wrapped.train()
    batch = make_batch(fam.task, torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = wrapped(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert wrapped.engine_status().backend == "ort"
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("family", sorted(EXTRA_FAMILIES))
def test_more_families_match_pytorch_with_sdpa_and_padding(family):
    fam = EXTRA_FAMILIES[family]
    gen = torch.Generator().manual_seed(4)
    batches = [make_batch(fam.task, gen) for _ in range(8)]
    assert_parity(*run_parity(build(fam, attn="sdpa"), batches))
