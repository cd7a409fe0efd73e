"""``aten::expm1`` (Apertus' xIELU), ``aten::permute`` with negative dims (Mamba-2 mixers) and the
bitwise ops (``bitwise_and`` / ``|`` / ``^`` on integers and booleans: T5Gemma2's and CPM-Ant's
attention masks) through ``wrap_model`` against PyTorch: values exactly as torch's, gradients as
torch's, fallback disabled and ORT proven to have run."""

from __future__ import annotations

import copy

import pytest
import torch
from parity import assert_parity, run_parity
from symbolic_cases import OPTIONS, Output, graph_ops

from ort_hf.engine import wrap_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- expm1 ---------------------------------------------------------------------------------------


class Expm1(torch.nn.Module):
    """xIELU's negative side, ``expm1(min(x, eps))``, on a per-feature scale (a Mul: exact in both)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x, target):
        y = torch.expm1(torch.minimum(x * self.scale, torch.tensor(-1e-6)))
        return Output(loss=((y - target) ** 2).mean(), out=y)


def test_expm1_is_torchs_to_the_bit_and_trains_as_pytorch():
    # Values down to 1e-9 from 0, where Exp(x) - 1 loses every digit (1e-9 -> 0 in float32), and to -30.
    g = torch.Generator().manual_seed(0)
    magnitudes = torch.logspace(-9, 1.5, 16)
    batches = [
        {
            "x": -magnitudes[torch.randint(0, 16, (32, 8), generator=g)] * torch.rand(32, 8, generator=g),
            "target": torch.randn(32, 8, generator=g),
        }
        for _ in range(3)
    ]
    model = Expm1()
    reference, wrapped = copy.deepcopy(model), wrap_model(copy.deepcopy(model), OPTIONS)
    wrapped.train()
    for batch in batches:
        got, want = wrapped(**batch).out, reference(**batch).out
        assert torch.equal(got, want), (got - want).abs().max()
    assert "ATen:expm1" in graph_ops(wrapped)
    assert_parity(*run_parity(model, batches, OPTIONS))


# ---- bitwise and / or / xor ----------------------------------------------------------------------


class Masks(torch.nn.Module):
    """The masks' shapes: int32 ``|`` bool (CPM-Ant), int ``&`` a Python int, int ``^`` int, and
    ``bitwise_and`` of two booleans (T5Gemma2), feeding a masked score."""

    def __init__(self, length=6):
        super().__init__()
        self.lin = torch.nn.Linear(length, length)

    def forward(self, x, context, span, target):
        ored = context[:, None, :] | (span[:, :, None] == span[:, None, :])  # int32 | bool -> int32
        anded = context & 0x5A5A  # int32 & int -> int32
        xored = torch.bitwise_xor(context[:, :, None], context[:, None, :].long())  # int32 ^ int64 -> int64
        keep = torch.bitwise_and(ored != 0, xored >= 0)  # bool & bool
        y = self.lin(x).masked_fill(~keep, 0.0) * (anded % 7).float()[:, None, :]
        return Output(loss=((y - target) ** 2).mean(), out=y, masks=(ored, anded, xored, keep))


def _mask_batches(n=3, batch=4, length=6):
    g = torch.Generator().manual_seed(0)
    return [
        {
            "x": torch.randn(batch, length, length, generator=g),
            # every bit pattern: signs, 0, and values past 16 bits (an inexact decomposition shows)
            "context": torch.randint(-(2**30), 2**30, (batch, length), generator=g, dtype=torch.int32)
            * torch.randint(0, 2, (batch, length), generator=g, dtype=torch.int32),
            "span": torch.randint(0, 2, (batch, length), generator=g),
            "target": torch.randn(batch, length, length, generator=g),
        }
        for _ in range(n)
    ]


def test_bitwise_ops_are_torchs_and_train_as_pytorch():
    batches = _mask_batches()
    model = Masks()
    reference, wrapped = copy.deepcopy(model), wrap_model(copy.deepcopy(model), OPTIONS)
    wrapped.train()
    for batch in batches:
        got, want = wrapped(**batch).masks, reference(**batch).masks
        for g_mask, w_mask in zip(got, want):
            assert g_mask.dtype == w_mask.dtype and torch.equal(g_mask, w_mask), (g_mask, w_mask)
    ops = graph_ops(wrapped)
    # integers below opset 18 run torch's op; the booleans are ONNX And
    assert {"ATen:__or__", "ATen:__and__", "ATen:__xor__", "And"} <= set(ops), ops
    assert_parity(*run_parity(model, batches, OPTIONS))


# ---- permute with negative dims ------------------------------------------------------------------


class NegativePermute(torch.nn.Module):
    """The Mamba-2 mixer's ``L.permute(0, -2, -1, 1)`` (a rank-4 tensor) between two weighted ops."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 5))

    def forward(self, x, target):
        y = (x * self.scale).exp().permute(0, -2, -1, 1) * self.scale[:, None]
        return Output(loss=((y - target) ** 2).mean(), out=y)


def test_permute_with_negative_dims_trains_as_pytorch():
    g = torch.Generator().manual_seed(0)
    batches = [
        {"x": torch.randn(2, 3, 4, 5, generator=g) * 0.1, "target": torch.randn(2, 4, 5, 3, generator=g)}
        for _ in range(3)
    ]
    wrapped = wrap_model(NegativePermute(), OPTIONS)
    wrapped.train()
    wrapped(**batches[0]).loss.backward()
    perms = [
        list(a.ints)
        for n in wrapped.training_graph().graph.node
        if n.op_type == "Transpose"
        for a in n.attribute
        if a.name == "perm"
    ]
    assert [0, 2, 3, 1] in perms and all(d >= 0 for p in perms for d in p), perms
    assert_parity(*run_parity(NegativePermute(), batches, OPTIONS))
