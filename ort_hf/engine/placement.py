"""Where a wrapped model trains: the device type every device-specific decision of the engine reads
(which of ort_hf's CPU kernels and padding rewrites enter the graph, ORT's thread settings).

ORT fixes its own ``_device`` when the ORTModule is built and runs its registered graph optimisers
for that device before it notices, at the same forward, that the model has moved
(``_training_manager.py`` 1.19.2: ``_build_graph`` then ``get_device_from_module_and_inputs``).
ort_hf therefore decides from the parameters and the inputs themselves, when the graph is built
and at every training forward, and rebuilds the session when they moved (``wrap.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def _kind(devices: Iterable[torch.device]) -> set[str]:
    return {d.type for d in devices if d.type != "meta"}


def model_device_type(module: nn.Module) -> str:
    """``"cuda"`` or ``"cpu"``: where all of ``module``'s parameters and buffers are. A model spread
    over several device types (``device_map``, CPU offload) is refused: one ORT session runs on one."""
    kinds = _kind(t.device for t in (*module.parameters(), *module.buffers()))
    if len(kinds) > 1:
        raise ValueError(
            f"ort_hf: {type(module).__name__} has parameters on {' and '.join(sorted(kinds))}; ORT runs "
            "one graph on one device. Move the whole model with .to(device) before training "
            "(no device_map or offload with --use_ort)."
        )
    kind = kinds.pop() if kinds else "cpu"
    if kind not in ("cpu", "cuda"):
        raise ValueError(
            f"ort_hf: {type(module).__name__} is on {kind}; ORT trains on cpu or cuda only. Move it "
            "with .to('cpu') or .to('cuda'), or pass --use_ort false."
        )
    return kind


def step_device_type(module: nn.Module, args: tuple, kwargs: dict) -> str:
    """The device type of one training forward, as ORT finds it (``get_device_from_module_and_inputs``):
    the first parameter's; the inputs' for a model without parameters. ORT copies the inputs to it."""
    first = next(module.parameters(), None)
    if first is not None:
        return first.device.type
    inputs = _kind(v.device for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))
    return "cuda" if "cuda" in inputs else "cpu"
