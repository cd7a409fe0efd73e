"""ONNX export symbolics that ORTModule needs on current torch to train Hugging Face models.

ORTModule exports the model with torch's TorchScript exporter and then builds the backward
graph itself from the exported ONNX forward. A few of torch's symbolics produce graphs that
export fine but that ORT cannot differentiate, or that are not valid ONNX; others are
missing. The replacements, one module per job, are registered with
``torch.onnx.register_custom_op_symbolic`` (custom symbolics take precedence over torch's own
for the opset they are registered in) by :func:`register_training_symbolics`, which the engine
calls once per ONNX opset before the first export:

- :mod:`.attention`: ``aten::scaled_dot_product_attention`` (in CPU training exports, PyTorch's
  flash-attention kernel where it applies: :mod:`.flash_attention`);
- :mod:`.packed_sequences`: ``aten::diff`` and ``aten::cumsum``;
- :mod:`.gradient_builder_fixes`: ``aten::where``, ``aten::layer_norm``, and (training exports
  only) ``aten::logsumexp``;
- :mod:`.index_add`: ``aten::index_add``, which torch's symbolic gets wrong for repeated indices;
- :mod:`.bias_gelu`: ``aten::gelu`` (training exports only);
- :mod:`.chunk`: ``prim::ConstantChunk`` (training exports only), in place of ORT's, whose outputs
  carried the first batch's shapes into the graph;
- :mod:`.histc`: ``aten::histc`` (mixture-of-experts token counts);
- :mod:`.rms_norm`: ``aten::rms_norm`` (``nn.RMSNorm``: ORT's ``SimplifiedLayerNormalization`` in
  training exports, standard ONNX ops in others);
- :mod:`.softplus`: ``aten::softplus`` (keeping torch's ``threshold``), and a gradient for ONNX
  ``Softplus``, which ORT lacks;
- :mod:`.conv_padding`: ``aten::_convolution_mode`` (``padding="same"`` as explicit pads, which
  ORT's CPU ConvGrad reads);
- :mod:`.grouped_mm`: ``aten::_grouped_mm`` (transformers' grouped experts; training exports
  only: an ORT ``ATen`` node, with its gradient entered into ORT's gradient table);
- :mod:`.random_draws`: ``aten::exponential`` and ``aten::uniform`` (PhiMoE's router noise;
  training exports only: ORT ``ATen`` nodes drawing from torch's generator);
- :mod:`.scatter`: ``aten::scatter``'s ``reduce=`` forms (exact, or refused where a gradient could be
  asked), and a bool fill value made traceable (DeepSeek-V3.2's indexer mask);
- :mod:`.scatter_reduce`: ``aten::scatter_reduce`` with ``include_self=False`` (TAPAS' segment
  reductions: ``sum`` and ``mean`` exact with their gradient, ``amax`` / ``amin`` where no gradient
  can be asked);
- :mod:`.solve_triangular`: ``aten::linalg_solve_triangular`` (gated delta-net layers; training
  exports only: an ORT ``ATen`` node, with its gradient entered into ORT's gradient table);
- :mod:`.expm1`: ``aten::expm1`` (training exports only: torch's own kernel in an ORT ``ATen``
  node, with its gradient entered into ORT's gradient table);
- :mod:`.bitwise`: ``aten::bitwise_and`` / ``or`` / ``xor`` (training exports only: ONNX ``And`` /
  ``Or`` / ``Xor`` on bools, ``Bitwise*`` from opset 18, ATen nodes on integers below it);
- :mod:`.repeat_interleave`: ``aten::repeat_interleave``, whose torch symbolic rewrote the traced
  graph's shared ``dim`` constant in place (interleaved RoPE: Helium, Cohere, GLM);
- :mod:`.einsum`: ``aten::einsum`` of one or two operands (training exports only: ``Transpose`` /
  ``ReduceSum`` / ``MatMul``, which ORT differentiates; LongT5's attention);
- :mod:`.fft`: ``aten::fft_fftn`` / ``aten::fft_fft2`` read through ``aten::real`` (FNet's token
  mixing: the real part of a 2-D DFT as ``MatMul``s with cosine and sine matrices, which ORT
  differentiates; ONNX ``DFT`` has no ORT gradient);
- :mod:`.permute`: ``aten::permute`` with negative dims made non-negative (ONNX ``Transpose``
  takes none; Mamba-2 mixers).

ORTModule re-registers its own symbolic table (which has ``layer_norm``, ``_convolution_mode``, and
``scaled_dot_product_attention`` when ``ORTMODULE_ATEN_SDPA_FALLBACK`` is set) on every
construction, which would put ORT's versions back over torch's registry. So the symbolics
here are also entered into ORT's table (``CustomOpSymbolicRegistry.register``), provided
:func:`register_training_symbolics` runs after ``onnxruntime.training.ortmodule`` is imported.
"""

from __future__ import annotations

import sys
import threading

import torch

from ..graph_repairs import STOP_GRADIENT_EDGES as _REPAIR_STOP_EDGES
from . import bitwise as _bitwise
from . import expm1 as _expm1
from . import fft as _fft
from . import flash_attention as _flash_attention
from . import grouped_mm as _grouped_mm
from . import packed_sequences as _packed_sequences
from . import scatter as _scatter
from . import scatter_reduce as _scatter_reduce
from . import softplus as _softplus
from . import solve_triangular as _solve_triangular
from .attention import sdpa
from .bias_gelu import gelu
from .chunk import constant_chunk
from .conv_padding import convolution_mode
from .einsum import einsum
from .gradient_builder_fixes import layer_norm, logsumexp, where
from .histc import histc
from .index_add import index_add
from .packed_sequences import cumsum, diff
from .permute import permute
from .random_draws import STOP_GRADIENT_EDGES as _DRAW_STOP_EDGES
from .random_draws import exponential, uniform
from .repeat_interleave import repeat_interleave
from .rms_norm import rms_norm, rms_norm_onnx

_DONE: set[int] = set()
_LOCK = threading.Lock()

SYMBOLICS = {
    "aten::scaled_dot_product_attention": sdpa,
    "aten::diff": diff,
    "aten::cumsum": cumsum,
    "aten::where": where,
    "aten::layer_norm": layer_norm,
    "aten::index_add": index_add,
    "aten::histc": histc,
    "aten::rms_norm": rms_norm_onnx,
    "aten::softplus": _softplus.softplus,
    "aten::_convolution_mode": convolution_mode,
    "aten::scatter": _scatter.scatter,
    "aten::scatter_reduce": _scatter_reduce.scatter_reduce,
    "aten::repeat_interleave": repeat_interleave,
    "aten::permute": permute,
    **_fft.SYMBOLICS,
}
# Entered into ORT's table only (over SYMBOLICS' entry of the same name): ORTModule registers it for
# its own export's opset on construction, so plain torch.onnx exports (inference) keep torch's
# symbolic, or SYMBOLICS' standard-ONNX one.
TRAINING_ONLY_SYMBOLICS = {
    "aten::gelu": gelu,
    "aten::logsumexp": logsumexp,
    "prim::ConstantChunk": constant_chunk,  # replaces ORT's own entry
    "aten::rms_norm": rms_norm,
    "aten::_grouped_mm": _grouped_mm.grouped_mm,
    "aten::exponential": exponential,
    "aten::uniform": uniform,
    "aten::linalg_solve_triangular": _solve_triangular.linalg_solve_triangular,
    **_bitwise.SYMBOLICS,
    "aten::expm1": _expm1.expm1,
    "aten::einsum": einsum,
}
# Gradients ORT lacks, entered into ORT's gradient table (ORTModule hands it to ORT on construction):
# (domain, op type[, ATen operator, overload name]) -> definition.
GRADIENTS = {
    **_grouped_mm.GRADIENTS,
    **_softplus.GRADIENTS,
    **_solve_triangular.GRADIENTS,
    **_expm1.GRADIENTS,
    **_packed_sequences.GRADIENTS,
    **_flash_attention.GRADIENTS,
}
# Edges ORT must not differentiate through: the random draws' shape-only input, and the detach
# graph_repairs puts before the inputs a Function's backward gives no gradient.
STOP_GRADIENT_EDGES = {**_DRAW_STOP_EDGES, **_REPAIR_STOP_EDGES}


_ORT_REGISTRY = "onnxruntime.training.ortmodule._custom_op_symbolic_registry"
_ORT_GRADIENTS = "onnxruntime.training.ortmodule._custom_gradient_registry"
_ort_done = False


def _register_with_ort() -> bool:
    """Put the symbolics into ORT's own table, which ORTModule re-registers on construction.

    Without this, constructing an ORTModule would put ORT's ``layer_norm`` (and, with
    ``ORTMODULE_ATEN_SDPA_FALLBACK`` set, its SDPA) back over ours. Only done once ORTModule
    has been imported (importing it needs the compat bridges first).
    """
    module, gradients = sys.modules.get(_ORT_REGISTRY), sys.modules.get(_ORT_GRADIENTS)
    if module is None or gradients is None:
        return False
    for name, fn in {**SYMBOLICS, **TRAINING_ONLY_SYMBOLICS}.items():
        domain, _, op = name.partition("::")
        module.CustomOpSymbolicRegistry.register(op, "" if domain == "aten" else domain, fn)
    for (domain, op_type, *attributes), definition in GRADIENTS.items():
        gradients.CustomGradientRegistry.register(domain, op_type, attributes, definition)
    for (domain, op_type, *attributes), edges in STOP_GRADIENT_EDGES.items():
        gradients.CustomGradientRegistry.register_custom_stop_gradient_edges(edges, domain, op_type, *attributes)
    return True


def register_training_symbolics(opset_version: int) -> None:
    """Register this module's symbolics for ``opset_version`` (idempotent; thread-safe).

    Call it after ``onnxruntime.training.ortmodule`` is imported and before the first
    ORTModule is built, so ORT's table carries them too. Affects every TorchScript ONNX export
    in the process at that opset, not only ORTModule's; the decompositions compute what torch
    computes, so plain exports stay correct.
    """
    global _ort_done
    opset_version = int(opset_version)
    with _LOCK:
        if opset_version not in _DONE:
            if opset_version < 14:
                raise ValueError(f"ort_hf's training symbolics need ONNX opset >= 14 (got {opset_version})")
            for name, fn in SYMBOLICS.items():
                torch.onnx.register_custom_op_symbolic(name, fn, opset_version)
            _DONE.add(opset_version)
        _scatter.install_bool_value_fix()
        if not _ort_done:
            _ort_done = _register_with_ort()
