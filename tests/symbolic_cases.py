"""What the op-symbolic tests share: ORT options for small graphs, a model output with a loss, and
the training graph's op names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from ort_hf.engine import ORTOptions

# One intra-op thread (the suite shares two cores); no pre-flight: some batches change length.
OPTIONS = ORTOptions(fallback="disable", log_level="ERROR", intra_op_threads=1, preflight="never")


@dataclass
class Output(ModelOutput):
    loss: torch.Tensor | None = None
    out: torch.Tensor | None = None
    masks: tuple | None = None


def graph_ops(wrapped) -> list[str]:
    """Op types of the training graph, ATen nodes as ``ATen:<operator>``."""
    names = []
    for node in wrapped.training_graph().graph.node:
        operator = next((a.s.decode() for a in node.attribute if a.name == "operator"), None)
        names.append(f"ATen:{operator}" if node.op_type == "ATen" else node.op_type)
    return names
