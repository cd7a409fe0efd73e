"""``aten::index_add`` that sums rows sent to the same index, as torch does.

torch's symbolic (opset 9, the only one) scatters ``source`` into zeros with a plain
``ScatterElements`` and adds ``self``: where ``index`` repeats, the last row wins instead of all
of them adding up (torch warns "does not support duplicated values in 'index'", and refuses only
when it can see the sizes). Mixture-of-experts layers merge each token's top-k expert outputs
exactly that way (JetMoE: ``zeros.index_add(0, batch_index, expert_outputs)``), so their forward
was wrong under ORT from the first batch.

From opset 16, ``ScatterElements(reduction="add")`` sums repeats. It scatters into zeros and
``self`` is added after, because ORT 1.19.2's ``ScatterElements`` gradient ignores ``reduction``:
it would zero ``self``'s gradient at the indexed rows (right for a plain scatter, wrong for a sum).
Through ``Add`` ``self`` gets the whole gradient, and ``source`` gets ``GatherElements`` of it,
which is right for a sum. ``alpha`` scales ``source``. Below opset 16 torch's symbolic is kept.
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers, torch_symbolics


def index_add(g, self, dim, index, source, alpha=None):
    symbolic_helper, _type_utils = exporter_helpers()
    if g.opset < 16:
        return torch_symbolics(9).index_add(g, self, dim, index, source, alpha)
    dim = symbolic_helper._get_const(dim, "i", "dim")
    rank = symbolic_helper._get_tensor_rank(self)
    source_rank = symbolic_helper._get_tensor_rank(source)
    if rank is None or source_rank is None:
        return symbolic_helper._unimplemented("index_add", "tensors of unknown rank", self)
    if dim < 0:
        dim += rank
    for _ in range(rank - source_rank):  # a lower-rank source, as torch's symbolic allows
        source = symbolic_helper._unsqueeze_helper(g, source, [symbolic_helper._get_tensor_rank(source)])
    source_type = _type_utils.JitScalarType.from_value(source, _type_utils.JitScalarType.FLOAT)
    if not symbolic_helper._is_none(alpha):
        scale = symbolic_helper._maybe_get_const(alpha, "f")
        if not isinstance(scale, (int, float)):  # a tensor: Cast, not CastLike (ORT has no CastLike gradient)
            source = g.op("Mul", source, g.op("Cast", alpha, to_i=source_type.onnx_type()))
        elif scale != 1:
            source = g.op("Mul", source, const(g, scale, source_type.dtype()))
    # index (1-D, along dim) broadcast to source's shape: [1, .., -1 at dim, .., 1], then Expand
    along = [1] * rank
    along[dim] = -1
    index = g.op("Reshape", index, const(g, along, torch.int64))
    index = g.op("Expand", index, g.op("Shape", source))
    dtype = _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.FLOAT)
    zeros = g.op("ConstantOfShape", g.op("Shape", self), value_t=torch.zeros(1, dtype=dtype.dtype()))
    summed = g.op("ScatterElements", zeros, index, source, axis_i=dim, reduction_s="add")
    return g.op("Add", self, summed)
