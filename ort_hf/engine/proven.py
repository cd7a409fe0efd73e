"""What the architecture sweep (``ort-hf sweep``, docs/architectures.md) proved for each model class.

``proven_architectures.json`` beside this file is written by the sweep's render step, never by
hand. A class is listed under:

* ``exact``: ORT's graph, with no padding rewrite, trained it as ``Trainer`` does (every step's
  loss within 1e-4 over ragged batches of changing length, step-1 gradients close). The first-batch
  pre-flight (``preflight.py``) is skipped for it.
* ``trim_padding`` / ``eliminate_padding``: the same with padding trim and padding elimination
  forced on, step-1 gradients as close as without them, and that rewrite acting in the run (a
  position dropped; a node run on the real tokens only): nothing it trains reads a padding position
  the rewrite removes. Each rewrite is on by default only for the classes listed for it.
* ``chunked_lm_loss``: the same, on packed rows with dense labels, with the fused chunked LM-head
  loss (``module_with_loss/chunked_lm_loss.py``) forced on and run in ORT's graph, step-1
  gradients as close: on by default, on dense labels, only for the classes listed.

A model of any other class (a head the sweep did not run, a family it did not prove, a user's own
module) trains without the rewrites and is checked by the pre-flight before its first step.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from torch import nn

PROVEN_FILE = Path(__file__).with_name("proven_architectures.json")


@lru_cache(maxsize=1)
def _proven() -> dict[str, frozenset[str]]:
    data = json.loads(PROVEN_FILE.read_text()) if PROVEN_FILE.exists() else {}
    keys = ("exact", "trim_padding", "eliminate_padding", "chunked_lm_loss")
    return {key: frozenset(data.get(key, ())) for key in keys}


def inner_model(module: nn.Module) -> nn.Module:
    """The model inside ort_hf's and PEFT's wrappers (ModuleWithLoss, the fused-head module, the
    stateful-forward wrapper, a PeftModel): the model whose class the sweep names."""
    for _ in range(8):
        owner = type(module).__module__ or ""
        if owner.startswith("peft.") and hasattr(module, "get_base_model"):
            module = module.get_base_model()
        elif owner.startswith("ort_hf.") and isinstance(getattr(module, "model", None), nn.Module):
            module = module.model
        elif owner.startswith("ort_hf.") and isinstance(getattr(module, "module", None), nn.Module):
            module = module.module
        else:
            break
    return module


def model_class_name(module: nn.Module) -> str:
    return type(inner_model(module)).__name__


def proven_exact(module: nn.Module) -> bool:
    return model_class_name(module) in _proven()["exact"]


def padding_rewrite_proven(module: nn.Module, rewrite: str) -> bool:
    """Whether the sweep proved ``rewrite`` (``trim_padding`` or ``eliminate_padding``) exact for the class."""
    return model_class_name(module) in _proven()[rewrite]


def fused_loss_proven(module: nn.Module) -> bool:
    """Whether the sweep proved the fused chunked LM-head loss exact for the class."""
    return model_class_name(module) in _proven()["chunked_lm_loss"]
