"""``aten::scaled_dot_product_attention`` in ORT's CPU training exports as PyTorch's own CPU
flash-attention kernel (``_scaled_dot_product_flash_attention_for_cpu``) in an ORT ``ATen`` node, with
its backward (``..._backward``) entered into ORT's gradient table.

PyTorch's eager SDPA runs that kernel on the CPU for float32 attention without dropout, with no mask,
``is_causal`` or a boolean mask alike (``torch._fused_sdp_choice``). It keeps the output and the
log-sum-exp for the backward. The decomposition of ``attention.py``, which ORT otherwise
differentiates, keeps the attention probabilities and a product of them, each batch x heads x
length x length: on a SmolLM2-135M shape at 4 x 256 tokens, 540 MB over its 30 layers
(``scripts/saved_for_backward.py``). With the kernel, ORT's graph computes what eager computes, to
the bit: the same kernel on the same operands. A boolean mask goes in as the additive float mask
eager's SDPA makes of it (0 where attended, -inf elsewhere); a query row with no key to attend gets 0,
as in eager. Keys and values of grouped-query attention go in with their own heads, as eager's
``enable_gqa`` passes them: the kernel shares each among its query heads and sums their gradients in
its own order, which a repeat before it would change (by about 1e-6).
In the built training graph the nodes run ort_hf's wrappers of the kernel and its backward
(``use_own_kernel``; ``csrc/cpu_flash_attention.cpp``), on PyTorch's threads.

Only where every condition holds (else the decomposition): a CPU training graph with
``ORTOptions.cpu_flash_attention`` on (``swap_switches``); every attention of the model's trace ran
eager's flash kernel (``torch._fused_sdp_choice`` on the traced tensors, recorded around the export
by ``recording_eager_kernel_choice``: the shapes the symbolic sees are dynamic, and eager takes its
math kernel for unequal head widths, as in DeepSeek's multi-head latent attention); and at this node
float32 query, key and value of rank 4, a constant zero dropout, a constant or absent scale, and no
mask or a boolean one of rank 4 without ``is_causal``. A float mask (a position bias that may need
its gradient) keeps the decomposition.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from ..._onnx_graph import aten_operator
from ..export_record import ACTIVE_EXPORT_RECORD
from .graph_ops import const, exporter_helpers, scalar_type

_ATEN = "org.pytorch.aten"
FLASH = "_scaled_dot_product_flash_attention_for_cpu"
FLASH_BACKWARD = f"{FLASH}_backward"


def _wanted() -> bool:
    record = ACTIVE_EXPORT_RECORD.get()
    return record is not None and "flash_attention" in record.kernel_swaps


class _EagerKernelChoice(torch.overrides.TorchFunctionMode):
    """Records, for each ``scaled_dot_product_attention`` the trace runs, whether eager SDPA would run
    the flash kernel on those tensors (``torch._fused_sdp_choice``, asked with tracing paused)."""

    def __init__(self):
        super().__init__()
        self.flash: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.flash.append(_eager_picks_flash(*args, **kwargs))
        return func(*args, **kwargs)


def _eager_picks_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    from torch.nn.attention import SDPBackend

    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        choice = torch._fused_sdp_choice(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    finally:
        torch._C._set_tracing_state(state)
    return choice == SDPBackend.FLASH_ATTENTION.value


# The choices recorded by the trace of the export running (None: no record, no kernel).
_TRACED_CHOICES: contextvars.ContextVar[_EagerKernelChoice | None] = contextvars.ContextVar(
    "ort_hf_traced_sdpa_choices", default=None
)


@contextlib.contextmanager
def recording_eager_kernel_choice():
    """Around an export (trace, then symbolics): eager's kernel choice for each attention traced,
    which the symbolic needs because the shapes it sees are dynamic (head widths unknown)."""
    if not _wanted():
        yield
        return
    mode = _EagerKernelChoice()
    token = _TRACED_CHOICES.set(mode)
    try:
        with mode:
            yield
    finally:
        _TRACED_CHOICES.reset(token)


def _eager_ran_flash_everywhere() -> bool:
    """Every attention of the trace ran eager's flash kernel (and one at least): a model with one
    that did not (unequal head widths, say) keeps the decomposition in all its layers."""
    mode = _TRACED_CHOICES.get()
    return mode is not None and bool(mode.flash) and all(mode.flash)


def flash_attention(g, query, key, value, attn_mask, dropout_p, is_causal, scale):
    """The kernel's output where its conditions hold (module docstring), else None."""
    if not _wanted():
        return None
    symbolic_helper, _type_utils = exporter_helpers()
    JST = _type_utils.JitScalarType
    if not _eager_ran_flash_everywhere() or any(
        scalar_type(t) != JST.FLOAT or symbolic_helper._get_tensor_rank(t) != 4 for t in (query, key, value)
    ):
        return None
    if symbolic_helper._maybe_get_const(dropout_p, "f") != 0.0:
        return None
    causal = symbolic_helper._maybe_get_const(is_causal, "b")
    if not isinstance(causal, bool) and not (isinstance(causal, torch.Tensor) and causal.numel() == 1):
        return None
    causal = bool(causal)
    no_scale = symbolic_helper._is_none(scale)
    if not no_scale and not isinstance(symbolic_helper._maybe_get_const(scale, "f"), float):
        return None
    masked = not symbolic_helper._is_none(attn_mask)
    if masked and (causal or scalar_type(attn_mask) != JST.BOOL or symbolic_helper._get_tensor_rank(attn_mask) != 4):
        return None
    mask = attn_mask
    if masked:  # eager SDPA's own conversion of a boolean mask
        mask = g.op("Where", attn_mask, const(g, 0.0, torch.float32), const(g, float("-inf"), torch.float32))
    scale_input = scale if no_scale else const(g, symbolic_helper._maybe_get_const(scale, "f"), torch.float32)
    out, log_sum_exp = g.op(
        f"{_ATEN}::ATen",
        query,
        key,
        value,
        const(g, 0.0, torch.float32),
        const(g, causal, torch.bool),
        mask,
        scale_input,
        operator_s=FLASH,
        overload_name_s="",
        outputs=2,
    )
    out.setType(query.type())  # ORT infers no type for an ATen node's outputs
    log_sum_exp.setType(query.type().with_sizes([None] * 3))
    return out


def flash_attention_gradient():
    """ORT gradient definition of the node above: the kernel's own backward, from the forward's
    inputs and its two outputs. ``I(3)`` to ``I(6)``: dropout, is_causal, mask, scale."""
    return [
        (
            ("ATen", _ATEN),
            ["GO(0)", "I(0)", "I(1)", "I(2)", "O(0)", "O(1)", "I(3)", "I(4)", "I(5)", "I(6)"],
            ["GI(0)", "GI(1)", "GI(2)"],
            {"operator": {"value": FLASH_BACKWARD, "dtype": "string"}},
        )
    ]


GRADIENTS = {(_ATEN, "ATen", FLASH, ""): flash_attention_gradient}


def name_unneeded_gradients(graph) -> int:
    """Give the kernel's backward nodes in a built training graph a named output for each gradient
    no one asked for (a frozen projection's keys: ORT leaves that output unnamed); returns how many.
    The kernel returns all three gradients, and ORT's ATen node fails on a returned tensor it has no
    output for (``invalid index -1``). The extra output is a float32 value nothing reads."""
    from onnx import TensorProto, helper

    named = 0
    for index, node in enumerate(graph.node):
        operator = aten_operator(node)
        if operator is None or operator.s != FLASH_BACKWARD.encode():
            continue
        outputs = list(node.output) + [""] * (3 - len(node.output))
        for i, name in enumerate(outputs):
            if not name:
                outputs[i] = f"{node.name or index}/unneeded_gradient_{i}"
                graph.value_info.append(helper.make_tensor_value_info(outputs[i], TensorProto.FLOAT, None))
                named += 1
        del node.output[:]
        node.output.extend(outputs)
    return named


# ort_hf's wrappers of the kernel and its backward (csrc/cpu_flash_attention.cpp): the same
# arguments and a thread count, causal wherever the mask is; the same bits.
OWN = {FLASH: ("ort_hf::flash_attention", 7), FLASH_BACKWARD: ("ort_hf::flash_attention_backward", 10)}


def use_own_kernel(graph, threads: int) -> int:
    """Point the kernel's nodes in a built training graph at ort_hf's wrappers, with ``threads``
    (PyTorch's thread count outside ORT's runs); returns how many forward nodes moved."""
    from onnx import TensorProto, helper

    threads_name = f"ort_hf/flash_attention_threads_{threads}"
    moved = 0
    for node in graph.node:
        operator = aten_operator(node)
        own = None if operator is None else OWN.get(operator.s.decode())
        if own is None:
            continue
        name, arguments = own
        inputs = list(node.input) + [""] * (arguments - len(node.input))  # absent optionals: mask, scale
        del node.input[:]
        node.input.extend(inputs + [threads_name])
        operator.s = name.encode()
        moved += name == OWN[FLASH][0]
    if moved:
        threads_value = helper.make_tensor(threads_name, TensorProto.INT64, [], [threads])
        graph.node.insert(0, helper.make_node("Constant", [], [threads_name], name=threads_name, value=threads_value))
    return moved
