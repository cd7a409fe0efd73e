"""Model code whose trace freezes a size computed from the batch's data, made traceable.

ORTModule traces the model once, on the first batch. A size the model reads out of a tensor into
Python (``.tolist()``, ``.item()``) is a plain number to the tracer, so the graph keeps the first
batch's value for every later batch (torch says so in a ``TracerWarning``;
``length_check.find_length_constants`` shows the node). No graph-side bridge can recover a value the
trace never recorded, so each fix here is per model class: it changes only what the class does
while it is traced (``torch.jit.is_tracing()``), so eager PyTorch runs exactly as before, and
wraps the class's own ``forward`` rather than copying it. :func:`apply_trace_fixes` installs
the fixes a model's modules need, once per class, before its first export.

- ``JetMoeTopKGating`` (transformers 5.x ``modeling_jetmoe``, read at 5.24): ``expert_size =
  gates.long().sum(0).tolist()`` counts the tokens routed to each expert, and
  ``JetMoeParallelExperts`` splits the sorted tokens by those counts: the trace froze the first
  batch's counts as the ``split`` sizes, so a later batch of another length failed
  (``ScatterElements`` index out of range) and one of the same length routed tokens to the wrong
  experts without an error. While traced, the counts are handed on as 0-d tensors, which
  ``Tensor.split`` traces as dynamic sizes. Can go when transformers keeps them a tensor.
"""

from __future__ import annotations

import torch

from .compat import _patch


def _jetmoe_expert_counts(forward):
    def traced_forward(self, hidden_states):
        out = forward(self, hidden_states)
        if not torch.jit.is_tracing() or not (isinstance(out, tuple) and len(out) == 5 and isinstance(out[3], list)):
            return out
        index_sorted_experts, batch_index, batch_gates, _, logits = out
        # the forward's own count (scatter of the top-k choices, summed over tokens), kept in the graph
        top_k_indices = logits.topk(self.top_k, dim=1).indices
        counts = torch.zeros_like(logits, dtype=torch.long).scatter(1, top_k_indices, 1).sum(0)
        return index_sorted_experts, batch_index, batch_gates, list(counts.unbind(0)), logits

    return traced_forward


# "<module>.<class>" -> (method, fix); a subclass gets its base class's fix.
FIXES = {
    "transformers.models.jetmoe.modeling_jetmoe.JetMoeTopKGating": ("forward", _jetmoe_expert_counts),
}


def apply_trace_fixes(model: torch.nn.Module) -> list[str]:
    """Install the fixes the classes of ``model``'s modules need (idempotent); return their names."""
    applied = []
    for cls in {type(m) for m in model.modules()}:
        for base in cls.__mro__:
            key = f"{base.__module__}.{base.__qualname__}"
            if key in FIXES:
                method, fix = FIXES[key]
                _patch(base, method, fix)
                applied.append(key)
                break
    return sorted(set(applied))
