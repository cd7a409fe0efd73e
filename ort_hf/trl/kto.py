"""``ORTKTOTrainer`` / ``ORTKTOConfig``: TRL's KTOTrainer with ORTTrainer's hooks.

TRL's ``compute_loss`` stays TRL's. Its policy forward (``fused_lm_head=True``) runs
``FusedLMHeadModule`` in the ORT session, forward and backward, the vocabulary projection on the
completion rows only. The KL estimate's forward on the mismatched completions is under ``no_grad`` in
TRL (it only shifts the rewards), so it runs TRL's head in PyTorch on the same weights, as do the
reference log-probabilities (``ref_model``, or the PEFT policy with its adapter disabled).
"""

from __future__ import annotations

from trl import KTOTrainer

from ..trainer.ort_trainer import ORTTrainerMixin
from .configs import ORTKTOConfig


class ORTKTOTrainer(ORTTrainerMixin, KTOTrainer):
    """Drop-in ``KTOTrainer`` whose policy forward and backward run in an ORT session; the KL
    estimate's and the reference's forwards (both without gradient) run in PyTorch."""

    ort_args_class = ORTKTOConfig
