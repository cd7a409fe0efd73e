"""Small ONNX graph-building helpers shared by the symbolics, and torch's TorchScript exporter
modules they build on."""

from __future__ import annotations

import torch

INT64_MAX = 2**63 - 1


def torch_symbolics(opset: int):
    """torch's own ``symbolic_opset<opset>`` module (under ``_internal`` since torch 2.9)."""
    import importlib

    return importlib.import_module(f"torch.onnx._internal.torchscript_exporter.symbolic_opset{opset}")


def exporter_helpers():
    """torch's TorchScript exporter helpers (under ``_internal`` since torch 2.9)."""
    from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

    return symbolic_helper, _type_utils


def exporting_for_training() -> bool:
    """Whether the running TorchScript export is a training one (ORTModule's in ``train()`` mode)."""
    from torch.onnx._internal.torchscript_exporter._globals import GLOBALS

    return GLOBALS.training_mode == torch.onnx.TrainingMode.TRAINING


def const(g, value, dtype):
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))


def scalar_type(value, default=None):
    _, _type_utils = exporter_helpers()
    undefined = _type_utils.JitScalarType.UNDEFINED
    st = _type_utils.JitScalarType.from_value(value, undefined)
    if st == undefined:
        return default
    return st


def shape_slice(g, shape, start, end):
    """``shape[start:end]`` of a 1-D int64 shape tensor."""
    return g.op(
        "Slice",
        shape,
        const(g, [start], torch.int64),
        const(g, [end], torch.int64),
        const(g, [0], torch.int64),
    )


def reduce_max_last(g, x):
    """ReduceMax over the last axis, keepdims (axes moved from attribute to input in opset 18)."""
    if g.opset >= 18:
        return g.op("ReduceMax", x, const(g, [-1], torch.int64), keepdims_i=1)
    return g.op("ReduceMax", x, axes_i=[-1], keepdims_i=1)


def slice_axis(g, x, axis, start, end):
    return g.op(
        "Slice",
        x,
        const(g, [start], torch.int64),
        const(g, [end], torch.int64),
        const(g, [axis], torch.int64),
    )
