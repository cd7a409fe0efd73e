"""Model state that ``forward`` writes, kept as PyTorch keeps it when ORT runs the model.

ORT runs the model's Python ``forward`` only while it exports (and in its output-structure
pass); after that its graph runs, with buffers frozen as constants. A buffer that ``forward``
writes would change during export only: BatchNorm's running statistics would hold the export's
batch, ``num_batches_tracked`` would stay 1, a step counter would stop.

At the first training step the engine compares every buffer before and after ORT's export.
When ``forward`` wrote any, the export's writes are undone and the model is exported again
through :class:`StatefulForward`: buffers that ``forward`` writes become graph inputs and
outputs, and each BatchNorm in training mode hands out its batch mean and variance; after every
step the buffers are updated in PyTorch exactly as PyTorch's own forward would have. Plain
Python attributes that ``forward`` changes cannot be carried through a graph: they are named in
a warning.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .._model_state import buffer_values, buffer_versions, python_attributes, restore_buffers

logger = logging.getLogger(__name__)

BUFFERS_ARG = "ort_hf_buffers"


class StateWatch:
    """What a module's buffers and Python attributes were before a forward that may export."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.versions = buffer_versions(module)
        self.values = buffer_values(module)
        self.attributes = python_attributes(module)
        self.parameter_versions = {name: p._version for name, p in module.named_parameters()}

    def written_buffers(self) -> list[str]:
        now = buffer_versions(self.module)
        return [name for name, version in now.items() if self.versions.get(name) != version]

    def report_python_state(self) -> None:
        changed = [
            f"{path or type(self.module).__name__}.{key}"
            for (path, key), value in python_attributes(self.module).items()
            if (path, key) in self.attributes and self.attributes[(path, key)] != value
        ]
        written = [
            name for name, p in self.module.named_parameters() if self.parameter_versions.get(name) != p._version
        ]
        if written:
            logger.warning(
                "ort_hf: forward writes parameters in place (%s). Under ORT the model's Python code runs only while "
                "it is exported, so they are not written during training: train such a model with --use_ort false.",
                ", ".join(written),
            )
        if changed:
            logger.warning(
                "ort_hf: forward changes Python attributes (%s). Under ORT the model's Python code runs only "
                "while it is exported, so they do not change during training. Keep such state in a buffer "
                "(register_buffer), which ORT carries, or train with --use_ort false.",
                ", ".join(changed),
            )

    def restore(self) -> None:
        restore_buffers(self.module, self.values)


class StatefulForward(nn.Module):
    """``module`` whose written buffers and BatchNorm batch statistics leave the graph as outputs.

    ``forward(..., ort_hf_buffers=(...))`` returns ``(output, written buffers, batch statistics)``;
    :meth:`apply` writes them into the module's buffers after the step.
    """

    def __init__(self, module: nn.Module, written: list[str]):
        super().__init__()
        self.module = module
        norms = {name: m for name, m in module.named_modules() if isinstance(m, _BatchNorm)}
        # BatchNorm buffers are updated from batch statistics, not carried through the graph.
        self.buffer_names = [n for n in written if n.rpartition(".")[0] not in norms]
        self._tracked = set(self.buffer_names) | {
            f"{path}.{attr}" if path else attr
            for path, m in norms.items()
            for attr, _ in m.named_buffers(recurse=False)
        }
        self._stats: list[torch.Tensor] | None = None
        self._called: list[_BatchNorm] = []
        self.batchnorm_calls: list[_BatchNorm] = []  # in the order the exported graph calls them
        self._hooks = [m.register_forward_pre_hook(self._record_batch_stats) for m in norms.values()]

    def _record_batch_stats(self, norm: _BatchNorm, args) -> None:
        if self._stats is None or not (norm.training and norm.track_running_stats and norm.running_mean is not None):
            return
        x = args[0].detach()
        dims = [0, *range(2, x.dim())]
        self._stats += [x.mean(dims), x.var(dims, correction=1)]  # running_var is unbiased, as in torch
        self._called.append(norm)

    def buffer_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.module.get_buffer(name) for name in self.buffer_names)

    def forward(self, *args, **kwargs):
        inputs = kwargs.pop(BUFFERS_ARG, ())
        owners = [self.module.get_submodule(name.rpartition(".")[0]) for name in self.buffer_names]
        attrs = [name.rpartition(".")[2] for name in self.buffer_names]
        saved = [owner._buffers[attr] for owner, attr in zip(owners, attrs)]
        self._stats, self._called = [], []
        try:
            for owner, attr, value in zip(owners, attrs, inputs):
                owner._buffers[attr] = value
            output = self.module(*args, **kwargs)
            written = tuple(owner._buffers[attr] for owner, attr in zip(owners, attrs))
            stats = tuple(self._stats)
            self.batchnorm_calls = self._called
        finally:
            for owner, attr, value in zip(owners, attrs, saved):
                owner._buffers[attr] = value
            self._stats = None
        return output, written, stats

    def snapshot(self) -> dict[str, torch.Tensor]:
        """The buffers this wrapper updates, to undo what a re-export's Python forward wrote."""
        return {
            name: buf.detach().clone()
            for name, buf in self.module.named_buffers()
            if name in self._tracked and buf is not None
        }

    @torch.no_grad()
    def apply(self, written: tuple, stats: tuple) -> None:
        """Write the step's buffer values and fold its batch statistics into the running ones."""
        for name, value in zip(self.buffer_names, written):
            self.module.get_buffer(name).copy_(value.detach())
        for norm, mean, var in zip(self.batchnorm_calls, stats[0::2], stats[1::2]):
            if norm.num_batches_tracked is not None:
                norm.num_batches_tracked.add_(1)
            factor = norm.momentum
            if factor is None:  # cumulative moving average, as torch's _BatchNorm.forward
                factor = 1.0 / float(norm.num_batches_tracked)
            norm.running_mean.mul_(1 - factor).add_(mean.detach().to(norm.running_mean.dtype), alpha=factor)
            norm.running_var.mul_(1 - factor).add_(var.detach().to(norm.running_var.dtype), alpha=factor)
