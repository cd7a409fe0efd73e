"""The first-batch check that ModuleWithLoss's cross-entropy is the model's loss runs on the fewest
first rows whose labels hold two classes (so that a class weighting shows), from PROBE_MIN_ROWS to
PROBE_ROWS."""

import torch
from tiny_models import FAMILIES, build

from ort_hf.module_with_loss import ModuleWithLoss
from ort_hf.module_with_loss.loss_choice import PROBE_MIN_ROWS, PROBE_ROWS, _rows_with_labels, choose_loss


def _batch(labels):
    labels = torch.tensor(labels)
    ids = torch.randint(3, 50, (labels.shape[0], 6), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _rows(module, labels) -> int:
    return _rows_with_labels(_batch(labels), module)["input_ids"].shape[0]


def test_rows_until_two_classes_are_labelled():
    cls = ModuleWithLoss(build(FAMILIES["bert-cls"]))
    assert (PROBE_MIN_ROWS, PROBE_ROWS) == (2, 4)
    assert _rows(cls, [1, 0, 1, 1, 0, 0]) == 2
    assert _rows(cls, [1, 1, 0, 1, 0, 0]) == 3
    assert _rows(cls, [1, 1, 1, 0, 0, 0]) == 4
    assert _rows(cls, [1, 1, 1, 1, 1, 0]) == 4  # one class in the first four: four, as before
    mlm = ModuleWithLoss(build(FAMILIES["bert-mlm"]))
    ignored = [-100] * 6
    assert _rows(mlm, [[5, 7, -100, -100, -100, -100], ignored, ignored, ignored, ignored]) == 2
    assert _rows(mlm, [[5, -100, -100, -100, -100, -100], ignored, [9] + ignored[1:], ignored, ignored]) == 3
    assert _rows(mlm, [ignored] * 4 + [[5, 7] + ignored[2:]]) == 5  # none in the first four: the batch


def test_the_choice_on_fewer_rows_still_finds_the_cross_entropy():
    module = ModuleWithLoss(build(FAMILIES["bert-cls"]))
    choice = choose_loss(module, _batch([1, 0, 1, 1, 0, 0]))
    assert choice.kind == "cross_entropy" and choice.reason is None
