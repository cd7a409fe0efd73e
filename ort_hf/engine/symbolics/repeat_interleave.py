"""``aten::repeat_interleave`` that leaves the traced graph's other constants alone.

torch's symbolic (opsets 9 and 13) reads a constant ``dim`` with ``_maybe_get_scalar``, which hands
back the ``Constant`` node's own tensor, and then normalises it in place (``dim += rank``). The
tracer pools equal constants, so every later op reading the same ``-1`` (``stack(dim=-1)``,
``flatten(-2)``, a ``softmax(dim=-1)``) is exported with the rank of ``repeat_interleave``'s input
added to it. Interleaved RoPE does exactly that: ``cos[..., :d // 2].repeat_interleave(2, dim=-1)``
before ``rotate_half``'s ``stack((-x2, x1), dim=-1).flatten(-2)`` (Helium, Cohere, Cohere2,
ERNIE 4.5, GLM's partial rotary). The stack then lands on the wrong axis, the product with ``cos``
broadcasts a rank-5 tensor against a rank-4 one, and ORT's symbolic shape inference fails with a
bare ``AssertionError`` (or ``All tensors must have the same rank``).

Here ``dim`` is handed to torch's symbolic as a fresh, already non-negative ``Constant``, so there
is nothing left for it to change in place. Can go with the TorchScript exporter (upstream is frozen).
"""

from __future__ import annotations

import torch

from .graph_ops import exporter_helpers, torch_symbolics


def repeat_interleave(g, self, repeats, dim=None, output_size=None):
    symbolic_helper, _ = exporter_helpers()
    if not symbolic_helper._is_none(dim) and symbolic_helper._is_constant(dim):
        axis = int(symbolic_helper._get_const(dim, "i", "dim"))  # a copy: the node's tensor stays as is
        rank = symbolic_helper._get_tensor_rank(self)
        if axis < 0 and rank is not None:
            axis += rank
        dim = g.op("Constant", value_t=torch.tensor(axis, dtype=torch.int64))
    return torch_symbolics(13 if g.opset >= 13 else 9).repeat_interleave(g, self, repeats, dim, output_size)
