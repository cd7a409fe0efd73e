"""ORT's label-sparsity decision and the densities its banner prints come from the whole first
batch (the trace); ``first_rows`` cuts a batch only along a dimension every tensor shares."""

import torch
from tiny_models import FAMILIES, SEQ, VOCAB, build

from ort_hf._batches import first_rows
from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.module_with_loss import ModuleWithLoss

ROWS = 6


def _mlm_batch(gen, dense_from_row=0, rows=ROWS):
    """MLM batch; rows before ``dense_from_row`` have one label each, the rest a label on every
    position."""
    ids = torch.randint(3, VOCAB, (rows, SEQ), generator=gen)
    labels = ids.clone()
    labels[:dense_from_row, 1:] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_first_rows_only_cuts_a_shared_batch_dimension():
    a, b, scalar = torch.zeros(5, 3), torch.zeros(5), torch.tensor(2.0)
    cut = first_rows([a, None, b, scalar, True], 2)
    assert [t.shape if torch.is_tensor(t) else t for t in cut] == [(2, 3), None, (2,), (), True]
    assert first_rows([a, torch.zeros(4)], 2) is None  # no common batch dimension
    assert first_rows([torch.zeros(2, 3)], 2) is None  # nothing to save


def test_label_sparsity_decided_on_the_whole_batch():
    # Rows 0-1 fully labelled, rows 2-5 one label each: ORT's hook
    # turns label sparsity on below 90% labelled, which the batch is (37.5%) and the two rows
    # alone (100%) are not. The trace decides, on the whole batch.
    gen = torch.Generator().manual_seed(1)
    batch = _mlm_batch(gen, dense_from_row=0)
    batch["labels"][2:, 1:] = -100  # rows 0-1 dense, rows 2-5 one label each
    wrapped = wrap_model(ModuleWithLoss(build(FAMILIES["bert-mlm"])), ORTOptions(fallback="disable", log_level="ERROR"))
    wrapped.train()
    wrapped(**batch)["loss"].backward()
    assert wrapped.engine_status().backend == "ort"
    assert wrapped.label_sparsity_fired(), "label sparsity must follow the whole batch (37.5% labelled)"
    densities = wrapped._training_manager()._runtime_inspector._sceloss_module_to_ignore_density_map
    assert list(densities.values()) == [100 * (2 * SEQ + 4) / (ROWS * SEQ)]


def test_banner_density_is_the_whole_batch():
    # Rows 0-1 one label each, the other 22 fully labelled: the batch is above ORT's 90% threshold,
    # so label sparsity stays off, and no density of the first rows alone (6%, "on") may be left
    # in what ORT's banner prints.
    gen = torch.Generator().manual_seed(2)
    rows = 24
    batch = _mlm_batch(gen, dense_from_row=2, rows=rows)
    assert (batch["labels"] != -100).float().mean() >= 0.9
    wrapped = wrap_model(ModuleWithLoss(build(FAMILIES["bert-mlm"])), ORTOptions(fallback="disable", log_level="ERROR"))
    wrapped.train()
    wrapped(**batch)["loss"].backward()
    assert wrapped.engine_status().backend == "ort"
    assert wrapped.label_sparsity_fired() is False
    assert wrapped._training_manager()._runtime_inspector._sceloss_module_to_ignore_density_map == {}
