"""Small look-ups over an ONNX graph's nodes, shared by the engine's rewrites and the loss checks."""

from __future__ import annotations

from collections.abc import Iterable


def readers_of(nodes: Iterable) -> dict[str, list]:
    """Each value name -> the nodes (in order) that take it as an input."""
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers
