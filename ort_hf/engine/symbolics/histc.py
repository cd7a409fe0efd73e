"""``aten::histc``: torch has no ONNX symbolic for it, and every mixture-of-experts family dies at
export without one.

transformers counts the tokens routed to each expert with it: ``integrations/moe.py``'s
``grouped_mm`` experts (the default experts implementation) call
``torch.histc(expert_ids.float(), bins=E, min=0, max=E - 1)``, and the load-balancing loss
``torch.histc(ids.float(), bins=E, min=0, max=E)``. Nothing is differentiated through it (torch
defines no derivative for ``histc``; its input is cast from integer ids).

It is exported in plain ONNX, exact for any float32 / float64 input (not only integer-valued
ones), by doing what torch's CPU kernel does for ``histc`` (``Histogram.cpp``: linear interpolation,
no search; ``cpu/HistogramKernel.cpp``): with ``lo, hi`` the input dtype's roundings of ``min``,
``max`` (the ends of its ``linspace`` edges), an element ``x`` with ``lo <= x <= hi`` (so not NaN)
goes to bin ``trunc((x - lo) * bins / (hi - lo))``, evaluated in the input's dtype in that order,
the last bin keeping its right edge (``bins`` becomes ``bins - 1``); other elements are not
counted. The one-hot of the bins is summed in int64 and cast to the input's dtype (what torch
returns). ``numel x bins`` comparisons: nothing for the few experts of a router. Half and
bfloat16 inputs are binned in float32 (torch rounds each step to the half type; ORT's CPU has
no half arithmetic): an element within rounding of an inner edge may land one bin over. Integer
inputs (CUDA's histc takes them) are binned in float32 too, by the CPU formula (not checked
against CUDA's kernel).

Only constant ``bins``, ``min`` < ``max`` (what transformers passes); ``min == max`` (torch then
takes the data's own range) is refused at export. It can go when torch's TorchScript exporter
gains a ``histc`` symbolic (none up to torch 2.13), or when ORT training is on the dynamo exporter.
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers, scalar_type


def histc(g, self, bins, min, max):  # noqa: A002  (torch's argument names)
    symbolic_helper, _type_utils = exporter_helpers()
    bins = symbolic_helper._get_const(bins, "i", "bins")
    low = symbolic_helper._get_const(min, "f", "min")
    high = symbolic_helper._get_const(max, "f", "max")
    if not low < high:
        symbolic_helper._onnx_unsupported(
            f"aten::histc with min ({low}) >= max ({high}), which bins the data's own range", self
        )
    st = scalar_type(self, _type_utils.JitScalarType.FLOAT)
    dtype = st.dtype() if st.dtype() in (torch.float32, torch.float64) else torch.float32
    if dtype != st.dtype():
        self = g.op("Cast", self, to_i=_type_utils.JitScalarType.from_dtype(dtype).onnx_type())
    lo, hi = torch.tensor(low, dtype=dtype), torch.tensor(high, dtype=dtype)
    x = g.op("Reshape", self, const(g, [-1, 1], torch.int64))  # [N, 1]
    in_range = g.op(
        "And",
        g.op("GreaterOrEqual", x, g.op("Constant", value_t=lo)),
        g.op("LessOrEqual", x, g.op("Constant", value_t=hi)),
    )  # NaN is out
    # torch: static_cast<int64_t>((elt - lo) * bins / (hi - lo)), each step in the input's dtype
    scaled = g.op(
        "Div",
        g.op("Mul", g.op("Sub", x, g.op("Constant", value_t=lo)), const(g, bins, dtype)),
        g.op("Constant", value_t=hi - lo),
    )
    # out-of-range elements (masked below) may give any index, NaN included: clip before the cast
    scaled = g.op("Clip", scaled, const(g, 0, dtype), const(g, bins - 1, dtype))
    bin_of = g.op("Cast", g.op("Floor", scaled), to_i=torch.onnx.TensorProtoDataType.INT64)
    one_hot = g.op("And", g.op("Equal", bin_of, const(g, list(range(bins)), torch.int64)), in_range)  # [N, bins]
    counts = g.op(
        "ReduceSum",
        g.op("Cast", one_hot, to_i=torch.onnx.TensorProtoDataType.INT64),
        const(g, [0], torch.int64),
        keepdims_i=0,
    )
    return g.op("Cast", counts, to_i=st.onnx_type())
