"""The CPU cross-entropy of the loss-in-PyTorch path equals nn.CrossEntropyLoss (sum, ignore_index)
in value and gradient, computed in float64 as the reference."""

import pytest
import torch

from ort_hf.module_with_loss.dense_cross_entropy import summed_cross_entropy


def _reference(logits, labels):
    x = logits.detach().double().requires_grad_()
    loss = torch.nn.CrossEntropyLoss(ignore_index=-100, reduction="sum")(x, labels)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("ignored", ["some", "none", "all"])
def test_value_and_gradient_match_cross_entropy(ignored):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(24, 301, generator=g) * 4).requires_grad_()
    labels = torch.randint(0, 301, (24,), generator=g)
    if ignored == "some":
        labels[::3] = -100
    elif ignored == "all":
        labels[:] = -100
    ref_loss, ref_grad = _reference(logits, labels)
    loss = summed_cross_entropy(logits, labels, -100)
    (loss * 0.37).backward()  # an upstream scale (1 / num_items_in_batch) reaches every row
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(logits.grad.double(), ref_grad * 0.37, rtol=0, atol=1e-6)
    if ignored != "none":
        assert logits.grad[labels == -100].abs().max() == 0


def test_labels_out_of_range_raise_as_cross_entropy_does():
    logits = torch.randn(4, 10, requires_grad=True)
    for bad in (10, -3):
        with pytest.raises((IndexError, RuntimeError)):
            summed_cross_entropy(logits, torch.tensor([1, 2, bad, 3]), -100)
    with pytest.raises(IndexError, match="Target -3 "):  # the offending label, not the ignored one
        summed_cross_entropy(logits, torch.tensor([-100, 2, -3, 3]), -100)


def test_without_gradient_it_is_torch_cross_entropy():
    logits = torch.randn(6, 11)
    labels = torch.tensor([1, -100, 3, 4, 0, 10])
    with torch.no_grad():
        loss = summed_cross_entropy(logits.requires_grad_(), labels, -100)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
