"""``ORTKTOTrainer`` / ``ORTKTOConfig``: TRL's KTOTrainer with ORTTrainer's hooks.

TRL's ``compute_loss`` stays TRL's. Its policy forward (``fused_lm_head=True``) runs
``FusedLMHeadModule`` in the ORT session, forward and backward, the vocabulary projection on the
completion rows only. The KL estimate's forward on the mismatched completions is under ``no_grad`` in
TRL (it only shifts the rewards), so it runs TRL's head in PyTorch on the same weights, as do the
reference log-probabilities (``ref_model``, or the PEFT policy with its adapter disabled).
"""

from __future__ import annotations

from dataclasses import dataclass

from trl import KTOConfig, KTOTrainer

from ..trainer.ort_trainer import ORTTrainerMixin
from ..trainer.training_args import ORTTrainingArguments
from .configs import _refuse_without_loss_module


@dataclass
class ORTKTOConfig(ORTTrainingArguments, KTOConfig):
    """``KTOConfig`` for :class:`ORTKTOTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s)."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)


class ORTKTOTrainer(ORTTrainerMixin, KTOTrainer):
    """Drop-in ``KTOTrainer`` whose policy forward and backward run in an ORT session; the KL
    estimate's and the reference's forwards (both without gradient) run in PyTorch."""

    ort_args_class = ORTKTOConfig
