"""ORT's export runs torch's ONNX shape inference without the weights' values.

torch's TorchScript exporter runs ONNX shape-type inference
(``torch._C._jit_pass_onnx_graph_shape_type_inference``, twice per export) with ``params_dict``,
the value of every parameter and buffer, and propagates constant values through them. On the
bench's ~485M Qwen2 (LoRA, ``ort-hf bench --workloads lora-485m``) that held 1.1 GB more resident
memory after the first pass than before it, peaked 1.6 GB above it, and took about half of the
export's time; it was the whole of ORT's first-step peak above the steady step. ORT exports with
``export_params=False``, so no value reaches its ONNX. A floating-point tensor of two or more
dimensions (a weight matrix, an embedding table) never decides a shape, so inside ORT's export its
value is withheld from the pass; scalars, vectors and integer tensors, which shape arithmetic
can read, keep theirs. The exported graph is the same byte for byte
(``tests/engine/test_shape_pass.py``).

``compat`` installs :func:`without_weight_values` over the pass once (with the torch bridges,
through its ``_patch``); it changes nothing outside :func:`weights_withheld`, which ``compat``'s
export bridge enters around ORT's export.
It can go with the TorchScript exporter itself (ORTModule needs it; upstream is frozen).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

PASS = "_jit_pass_onnx_graph_shape_type_inference"  # on torch._C
_withholding: contextvars.ContextVar[bool] = contextvars.ContextVar("ort_hf_withhold_weights", default=False)


def decides_no_shape(value) -> bool:
    """Whether ``value`` is a tensor whose values shape inference never needs: floats, 2-D or more."""
    return torch.is_tensor(value) and value.is_floating_point() and value.dim() >= 2


def without_weight_values(original):
    """``original`` (the pass), given no weight values inside :func:`weights_withheld`."""

    def shape_type_inference(graph, params_dict, opset_version):
        if _withholding.get():
            params_dict = {name: value for name, value in params_dict.items() if not decides_no_shape(value)}
        return original(graph, params_dict, opset_version)

    return shape_type_inference


@contextlib.contextmanager
def weights_withheld():
    """Inside: the exporter's shape inference gets no weight values (see the module docstring)."""
    token = _withholding.set(True)
    try:
        yield
    finally:
        _withholding.reset(token)
