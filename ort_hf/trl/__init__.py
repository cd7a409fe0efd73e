"""TRL through ORT: ``ORTSFTTrainer``, ``ORTDPOTrainer``, ``ORTKTOTrainer``, ``ORTRewardTrainer``,
``ORTGRPOTrainer`` and ``ORTRLOOTrainer``, with their configs.

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
    "ORTRewardConfig": "ort_hf.trl.configs",
    "ORTRewardTrainer": "ort_hf.trl.reward",
    "ORTKTOConfig": "ort_hf.trl.configs",
    "ORTKTOTrainer": "ort_hf.trl.kto",
    "ORTGRPOConfig": "ort_hf.trl.configs",
    "ORTGRPOTrainer": "ort_hf.trl.online_trainers",
    "ORTRLOOConfig": "ort_hf.trl.configs",
    "ORTRLOOTrainer": "ort_hf.trl.online_trainers",
}

if TYPE_CHECKING:  # the lazy names, for type checkers and IDEs (nothing is imported at run time)
    # ruff: noqa: F401 (each is in __all__, through _LAZY)
    from .configs import ORTDPOConfig, ORTGRPOConfig, ORTKTOConfig, ORTRewardConfig, ORTRLOOConfig, ORTSFTConfig
    from .kto import ORTKTOTrainer
    from .online_trainers import ORTGRPOTrainer, ORTRLOOTrainer
    from .reward import ORTRewardTrainer
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
