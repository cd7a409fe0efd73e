"""``aten::einsum`` through ``wrap_model`` against PyTorch: LongT5's attention equations and the other
one- and two-operand forms the decomposition takes (batch, contracted and kept labels, labels summed
by one operand, broadcast ellipsis, implicit output), forward and gradients, fallback disabled and ORT
proven to have run, with no ``Einsum`` node left (ORT has no gradient for it)."""

from __future__ import annotations

import pytest
import torch
from parity import assert_parity, run_parity
from symbolic_cases import OPTIONS, Output, graph_ops

from ort_hf.engine import wrap_model
from ort_hf.engine.symbolics.einsum import _pair_fits, _parse

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# equation, operand shapes
CASES = [
    ("...qhd,...khd->...hqk", [(2, 5, 3, 4), (2, 6, 3, 4)]),  # LongT5: scores
    ("...hqk,...khd->...qhd", [(2, 3, 5, 6), (2, 6, 3, 4)]),  # LongT5: attention output
    ("...nd,...ng->...gd", [(2, 7, 4), (2, 7, 3)]),  # LongT5: transient-global aggregates
    ("bij,jk->bik", [(2, 3, 4), (4, 5)]),  # a batch on one side only
    ("ij,kj->", [(3, 4), (5, 4)]),  # implicit output, everything summed... after a kept pair
    ("i,j->ij", [(4,), (5,)]),  # outer product: nothing contracted
    ("bi,bi->b", [(3, 4), (3, 4)]),  # nothing kept
    ("abc,c->ab", [(2, 3, 4), (4,)]),  # a summed label on one side only, after MatMul
    ("xyz->zx", [(2, 3, 4)]),  # one operand: sum and transpose
    ("...ij,jk", [(3, 4), (4, 5)]),  # implicit output, an ellipsis covering nothing
    ("ibnd,hnd->ibh", [(2, 6, 3, 5), (4, 3, 5)]),  # XLNet: two contracted labels (ORT's own symbolic's MatMul)
    ("b...d,...d->b...", [(2, 3, 4), (1, 4)]),  # broadcast of a size-1 ellipsis dim
]


class Einsums(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.linspace(0.5, 1.5, shapes[0][-1])) for _, shapes in CASES]
        )

    def forward(self, target, **operands):
        outs = [
            torch.einsum(eq, operands[f"x{i}_0"] * scale, *[operands[f"x{i}_{j}"] for j in range(1, len(shapes))])
            for i, ((eq, shapes), scale) in enumerate(zip(CASES, self.scales))
        ]
        loss = sum(((o.float() - target) ** 2).mean() * (k + 1) for k, o in enumerate(outs))
        return Output(loss=loss, out=torch.cat([o.reshape(-1) for o in outs]))


def _batches(n=3):
    g = torch.Generator().manual_seed(0)
    return [
        {
            "target": torch.randn((), generator=g),
            **{
                f"x{i}_{j}": torch.randn(shape, generator=g)
                for i, (_, shapes) in enumerate(CASES)
                for j, shape in enumerate(shapes)
            },
        }
        for _ in range(n)
    ]


def test_einsum_trains_as_pytorch_without_an_einsum_node():
    batches = _batches()
    wrapped = wrap_model(Einsums(), OPTIONS)
    wrapped.train()
    got, want = wrapped(**batches[0]).out, Einsums()(**batches[0]).out
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "Einsum" not in graph_ops(wrapped)
    assert_parity(*run_parity(Einsums(), batches, OPTIONS))


def test_equations_left_to_torch():
    assert _parse("ii->i", [2]) is None  # a diagonal
    assert _parse("...ij->ij", [3]) is None  # ellipsis summed out
    operands, _, out = _parse("bik,bkj->bij", [3, 3])
    assert _pair_fits(operands[0], operands[1], out)
    operands, _, out = _parse("bijk,bjkl->bil", [4, 4])  # two contracted labels: a reshape
    assert not _pair_fits(operands[0], operands[1], out)
