"""``aten::permute`` with its dimensions made non-negative.

torch's symbolic passes ``permute``'s dims to ONNX ``Transpose`` as written, so ``x.permute(0, -2, -1, 1)``
(transformers' Mamba-2 mixer: Mamba2, Bamba, Falcon-H1, GraniteMoeHybrid) exports ``perm=[0, -2, -1, 1]``.
ONNX requires a permutation of ``0..rank-1``; ORT's symbolic shape inference, which ORTModule runs on
every training export, cannot infer that node's output and stops the export. ``permute`` names every
dimension once, so the rank is ``len(dims)`` and each negative dim is ``dim + len(dims)``.
"""

from __future__ import annotations

from torch.onnx import symbolic_helper


@symbolic_helper.parse_args("v", "is")
def permute(g, self, dims):
    rank = len(dims)
    perm = [d + rank if d < 0 else d for d in dims]
    if perm == list(range(rank)):
        return self
    return g.op("Transpose", self, perm_i=perm)
