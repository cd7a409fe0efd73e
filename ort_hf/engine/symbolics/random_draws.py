"""``aten::exponential`` and ``aten::uniform`` (``Tensor.exponential_``, ``Tensor.uniform_``) as ORT
``ATen`` nodes. torch has no ONNX symbolic for either; PhiMoE's router calls both in training
(Gumbel noise ``-empty_like(x).exponential_().log()``, and ``rand_like(x).uniform_()``).

The nodes run torch's own kernels, so the draws come from torch's default generator
(``torch.manual_seed`` seeds them) with torch's distributions, not from ORT's RNG as ONNX
``RandomUniformLike`` would. They still cannot repeat PyTorch's run of the same model draw for
draw: ORTModule's export runs the forward once more, and ORT's own random ops in the same graph
(``rand_like`` itself is exported as ``RandomUniformLike``) do not advance torch's generator, so
the two runs' streams fall out of step. Nothing is differentiated through them (torch's
derivative is zero; the draw reads only the input's shape and dtype): their input edge is marked
as stopping the gradient, as ORT does for its ``multinomial`` node. ORT treats ops of unknown
domains as non-deterministic, so its optimisers neither fold nor merge these nodes.

Only without a ``generator`` argument (an ATen node cannot carry one). They can go when torch's
TorchScript exporter gains these symbolics (none up to torch 2.13).
"""

from __future__ import annotations

import torch

from .graph_ops import exporter_helpers

_ATEN = "org.pytorch.aten"


def _float_argument(g, value, name):
    """An ATen ``float`` argument: a float32 scalar (ORT's aten_op_executor reads no other type)."""
    symbolic_helper, _ = exporter_helpers()
    return g.op("Constant", value_t=torch.tensor(symbolic_helper._get_const(value, "f", name), dtype=torch.float32))


def _draw(g, operator, self, floats, generator):
    symbolic_helper, _ = exporter_helpers()
    if not symbolic_helper._is_none(generator):
        symbolic_helper._onnx_unsupported(f"aten::{operator} with a generator", self)
    out = g.op(f"{_ATEN}::ATen", self, *floats, generator, operator_s=operator)
    out.setType(self.type())  # ORT infers no type for an ATen node's output
    return out


def exponential(g, self, lambd, generator):
    return _draw(g, "exponential", self, [_float_argument(g, lambd, "lambd")], generator)


def uniform(g, self, low, high, generator):
    return _draw(g, "uniform", self, [_float_argument(g, low, "from"), _float_argument(g, high, "to")], generator)


# Their input is read only for its shape and dtype: no gradient flows back through it.
STOP_GRADIENT_EDGES = {(_ATEN, "ATen", "exponential", ""): [0], (_ATEN, "ATen", "uniform", ""): [0]}
