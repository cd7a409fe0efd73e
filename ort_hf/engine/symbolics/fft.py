"""``aten::fft_fftn`` / ``aten::fft_fft2`` followed by ``aten::real`` (FNet's token mixing) as matrix
products ORT differentiates.

FNet mixes tokens with ``torch.fft.fftn(hidden_states, dim=(1, 2)).real``: the real part of the 2-D
DFT over (sequence, hidden) of a real input. torch's TorchScript exporter has no symbolic for
``fft_fftn``, and ONNX's ``DFT`` has no gradient in ORT 1.19.2. For a real ``X`` of shape
``[..., L, H]``, with ``F_N = C_N - i S_N``, ``C_N[k, n] = cos(2 pi k n / N)``, ``S_N = sin(...)``
(symmetric), ``Re(F_L X F_H) = C_L X C_H - S_L X S_H``: four ``MatMul``s on matrices built in the
graph from the runtime sizes (``k n`` is reduced modulo ``N`` in integers first, so the angles keep
float32 precision at any length).

Only that pattern: a real floating-point input, the transform over its last two dims, no ``s``, the
default (``"backward"``) normalisation, and every use of the complex result an ``aten::real``;
``aten::real`` of that result is then the value computed here (and of a real tensor, the tensor).
Anything else stays unsupported, as in torch. It can go when ORT differentiates ``DFT``.
"""

from __future__ import annotations

import math

import torch

from .graph_ops import const, exporter_helpers, scalar_type


def _cos_sin(g, x, axis):
    """``C_N`` and ``S_N`` for ``N = x.shape[axis]``, in ``x``'s dtype."""
    n = g.op("Gather", g.op("Shape", x), const(g, axis, torch.int64), axis_i=0)  # a scalar
    steps = g.op("Range", const(g, 0, torch.int64), n, const(g, 1, torch.int64))
    products = g.op(
        "Mul",
        g.op("Unsqueeze", steps, const(g, [1], torch.int64)),
        g.op("Unsqueeze", steps, const(g, [0], torch.int64)),
    )
    turns = g.op(
        "Div",
        g.op("Cast", g.op("Mod", products, n), to_i=scalar_type(x).onnx_type()),
        g.op("Cast", n, to_i=scalar_type(x).onnx_type()),
    )
    dtype = scalar_type(x).dtype()
    angles = g.op("Mul", turns, const(g, 2 * math.pi, dtype))
    return g.op("Cos", angles), g.op("Sin", angles)


def _real_2d_dft(g, x, rank):
    c_h, s_h = _cos_sin(g, x, rank - 1)
    c_l, s_l = _cos_sin(g, x, rank - 2)
    return g.op("Sub", g.op("MatMul", c_l, g.op("MatMul", x, c_h)), g.op("MatMul", s_l, g.op("MatMul", x, s_h)))


def _is_last_two(dims, rank) -> bool:
    return rank is not None and rank >= 2 and sorted(d % rank for d in dims) == [rank - 2, rank - 1]


def fft_2d(name):
    def symbolic(g, self, s, dim, norm):
        symbolic_helper, _ = exporter_helpers()
        rank = symbolic_helper._get_tensor_rank(self)
        dims = None if symbolic_helper._is_none(dim) else symbolic_helper._maybe_get_const(dim, "is")
        norm = None if symbolic_helper._is_none(norm) else symbolic_helper._maybe_get_const(norm, "s")
        st = scalar_type(self)
        uses = [use.user.kind() for use in g.original_node.output().uses()]
        if dims is None and name == "fft_fft2":
            dims = [-2, -1]
        if (
            st is None
            or not st.dtype().is_floating_point
            or not symbolic_helper._is_none(s)
            or norm not in (None, "backward")
            or not isinstance(dims, (list, tuple))
            or not _is_last_two(dims, rank)
            or not uses
            or any(kind != "aten::real" for kind in uses)
        ):
            symbolic_helper._onnx_unsupported(
                f"aten::{name} other than the real part of a 2-D transform of a real tensor over its last two dims",
                self,
            )
        out = _real_2d_dft(g, self, rank)
        out.setType(self.type())
        return out

    return symbolic


def real(g, self):
    """The real part: the value itself once :func:`fft_2d` has taken it (or of a real tensor)."""
    symbolic_helper, _ = exporter_helpers()
    st = scalar_type(self)
    if st is None or st.dtype().is_complex:
        symbolic_helper._onnx_unsupported("aten::real of a complex tensor", self)
    return self


SYMBOLICS = {"aten::fft_fftn": fft_2d("fft_fftn"), "aten::fft_fft2": fft_2d("fft_fft2"), "aten::real": real}
