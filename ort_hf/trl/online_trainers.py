"""``ORTGRPOTrainer`` and ``ORTRLOOTrainer``: TRL's online trainers whose policy forward and backward run in ORT.

TRL's ``compute_loss`` calls the policy with ``fused_lm_head=True`` for the per-token
log-probabilities and entropies of the completion tokens; through ORT that call runs
``FusedLMHeadModule`` (the backbone and the head on the completion rows, in one ORT graph).
Generation, rewards, the old-policy and reference log-probabilities (``no_grad``) stay TRL's, in
PyTorch, on the same parameter tensors ORT trains (``ort_hf/trl/online.py``). Refused before
training, by their configs: ``use_vllm`` and ``use_liger_kernel``.
"""

from __future__ import annotations

from trl import GRPOTrainer, RLOOTrainer

from ..trainer.ort_trainer import ORTTrainerMixin
from .configs import ORTGRPOConfig, ORTRLOOConfig
from .online import generation_on_torch_model


class _GenerateOnTorchModel:
    """Completions generated with transformers' ``generate`` on ``self.model``, whose parameters are
    the ones the ORT session trains (no copy, nothing stale after an optimizer step)."""

    def _generate_single_turn(self, *args, **kwargs):
        with generation_on_torch_model(self):
            return super()._generate_single_turn(*args, **kwargs)


class ORTGRPOTrainer(_GenerateOnTorchModel, ORTTrainerMixin, GRPOTrainer):
    """Drop-in ``GRPOTrainer`` whose policy forward and backward run in an ORT session."""

    ort_args_class = ORTGRPOConfig


class ORTRLOOTrainer(_GenerateOnTorchModel, ORTTrainerMixin, RLOOTrainer):
    """Drop-in ``RLOOTrainer`` whose policy forward and backward run in an ORT session."""

    ort_args_class = ORTRLOOConfig
