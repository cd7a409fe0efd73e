"""The summed cross-entropy of ``LossInPyTorch`` (dense token labels, loss outside the ORT graph)
on CPU, with one ``[tokens, vocab]`` buffer instead of three.

``nn.CrossEntropyLoss`` on CPU allocates three tensors the size of the logits per step: the
log-softmax it saves, the zero-filled gradient of ``nll_loss`` and the gradient of the
log-softmax. For a causal LM these are ``tokens x vocab`` floats (250 MB for 2,048 tokens and a
30k vocabulary); each is freshly mapped memory, and faulting its pages in costs about as much as
the arithmetic. Here the forward pass writes the softmax once, into the buffer the backward pass
turns into the gradient in place (``(softmax - one_hot(label)) * grad / row``). The value is the
same cross-entropy (``logsumexp - logit[label]``, summed over labels that are not
``ignore_index``), and the gradient is at least as exact as ``nn.CrossEntropyLoss``'s, which
takes ``exp(log_softmax)``. Elsewhere (another device, no gradient needed) ``F.cross_entropy``
runs.
"""

from __future__ import annotations

import torch
from torch import nn


class _SoftmaxInPlaceCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
        valid = labels != ignore_index
        target = labels.masked_fill(~valid, 0)
        shift = logits.amax(dim=-1, keepdim=True)
        probs = torch.sub(logits, shift)
        probs.exp_()
        total = probs.sum(dim=-1, keepdim=True)
        probs.div_(total)
        log_sum_exp = (shift + total.log()).squeeze(-1)
        picked = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # raises on labels out of range, as nll_loss
        ctx.save_for_backward(probs, target, valid)
        return ((log_sum_exp - picked) * valid).sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        probs, target, valid = ctx.saved_tensors
        row_scale = grad * valid.to(probs.dtype)
        probs[torch.arange(probs.shape[0], device=probs.device), target] -= 1
        probs.mul_(row_scale.unsqueeze(-1))
        return probs, None, None


def summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """``nn.CrossEntropyLoss(ignore_index=ignore_index, reduction="sum")(logits, labels)`` for
    2-D float ``logits`` and 1-D ``labels``."""
    if logits.device.type != "cpu" or not (torch.is_grad_enabled() and logits.requires_grad) or logits.dim() != 2:
        return nn.functional.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    negative = labels[labels.lt(0) & labels.ne(ignore_index)]
    if negative.numel():
        raise IndexError(f"Target {int(negative[0])} is out of bounds.")  # nll_loss's error
    return _SoftmaxInPlaceCrossEntropy.apply(logits, labels, ignore_index)
