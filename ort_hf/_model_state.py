"""A model's state outside its parameters (buffers, plain Python attributes), saved and put back.

Shared by the engine, whose export runs the model's forward in PyTorch only to trace it, and by
ModuleWithLoss's first-batch check: neither must change what the model holds.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

_SIMPLE = (bool, int, float, str)


def buffer_values(module: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every buffer, by its dotted name."""
    return {name: buf.detach().clone() for name, buf in module.named_buffers() if buf is not None}


def buffer_versions(module: nn.Module) -> dict[str, tuple[int, int]]:
    """Each buffer's identity and in-place version counter: changes when forward writes it."""
    return {name: (id(buf), buf._version) for name, buf in module.named_buffers() if buf is not None}


def restore_buffers(module: nn.Module, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in values.items():
            owner, _, attr = name.rpartition(".")
            target = module.get_submodule(owner) if owner else module
            current = target._buffers.get(attr)
            if current is not None and current.shape == value.shape and current.dtype == value.dtype:
                current.copy_(value)
            else:
                target._buffers[attr] = value


def python_attributes(module: nn.Module) -> dict[tuple[str, str], object]:
    """Every submodule's public attributes of a plain type (counters, flags, names)."""
    return {
        (path, key): value
        for path, sub in module.named_modules()
        for key, value in vars(sub).items()
        if not key.startswith("_") and key != "training" and isinstance(value, _SIMPLE)
    }


@contextlib.contextmanager
def side_effect_free(module: nn.Module):
    """Run ``module`` without leaving a trace: no gradients, torch's RNG and every buffer as they were."""
    saved = buffer_values(module)
    devices = sorted({p.device.index or 0 for p in module.parameters() if p.is_cuda})
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            yield
    finally:
        restore_buffers(module, saved)
