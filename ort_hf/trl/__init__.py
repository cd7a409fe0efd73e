"""TRL through ORT: ``ORTSFTTrainer`` / ``ORTSFTConfig``, ``ORTDPOTrainer`` / ``ORTDPOConfig``,
``ORTGRPOTrainer`` / ``ORTGRPOConfig`` and ``ORTRLOOTrainer`` / ``ORTRLOOConfig``.

Needs ``pip install 'ort_hf[trl]'``; importing ``ort_hf.trl`` is cheap, TRL is imported when one
of these names is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

_LAZY = {
    "ORTSFTConfig": "ort_hf.trl.configs",
    "ORTDPOConfig": "ort_hf.trl.configs",
    "ORTSFTTrainer": "ort_hf.trl.trainers",
    "ORTDPOTrainer": "ort_hf.trl.trainers",
    "ORTGRPOConfig": "ort_hf.trl.grpo",
    "ORTGRPOTrainer": "ort_hf.trl.grpo",
    "ORTRLOOConfig": "ort_hf.trl.rloo",
    "ORTRLOOTrainer": "ort_hf.trl.rloo",
}

if TYPE_CHECKING:  # the lazy names, for type checkers and IDEs (nothing is imported at run time)
    # ruff: noqa: F401 (each is in __all__, through _LAZY)
    from .configs import ORTDPOConfig, ORTSFTConfig
    from .grpo import ORTGRPOConfig, ORTGRPOTrainer
    from .rloo import ORTRLOOConfig, ORTRLOOTrainer
    from .trainers import ORTDPOTrainer, ORTSFTTrainer

INSTALL_HINT = "TRL is not installed: pip install 'ort_hf[trl]' (trl 1.16)."


def __getattr__(name):
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as exc:
            if exc.name == "trl":
                raise ImportError(f"ort_hf.trl.{name}: {INSTALL_HINT}") from exc
            raise
        return getattr(module, name)
    raise AttributeError(f"module 'ort_hf.trl' has no attribute {name!r}")


__all__ = list(_LAZY)
