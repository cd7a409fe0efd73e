"""``ORTRLOOTrainer`` / ``ORTRLOOConfig``: TRL's RLOOTrainer whose policy forward and backward run in ORT.

TRL's ``compute_loss`` calls the policy with ``fused_lm_head=True`` for the per-token
log-probabilities and entropies of the completion tokens; through ORT that call runs
``FusedLMHeadModule`` (the backbone and the head on the completion rows, in one ORT graph).
Generation, rewards, the old-policy and reference log-probabilities (``no_grad``) stay TRL's, in
PyTorch, on the same parameter tensors ORT trains (``ort_hf/trl/online.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trl import RLOOConfig, RLOOTrainer

from ..trainer.ort_trainer import ORTTrainerMixin
from ..trainer.training_args import ORTTrainingArguments
from .configs import _refuse_without_loss_module
from .online import as_ort_online_config, generation_on_torch_model, refuse_online_options


@dataclass
class ORTRLOOConfig(ORTTrainingArguments, RLOOConfig):
    """``RLOOConfig`` for :class:`ORTRLOOTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s: ``bf16`` left unset is fp32 on CPU)."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)


class ORTRLOOTrainer(ORTTrainerMixin, RLOOTrainer):
    """Drop-in ``RLOOTrainer`` whose policy forward and backward run in an ORT session.

    Completions are generated with transformers' ``generate`` on ``self.model``, whose parameters
    are the ones the ORT session trains (no copy, nothing stale after an optimizer step). Refused
    before training: ``use_vllm`` and ``use_liger_kernel``."""

    ort_args_class = ORTRLOOConfig

    def __init__(self, *args, **kwargs):
        args, kwargs, config = as_ort_online_config(RLOOTrainer, RLOOConfig, ORTRLOOConfig, args, kwargs)
        if config is not None:
            refuse_online_options(config, type(self).__name__)
        super().__init__(*args, **kwargs)

    def _generate_single_turn(self, *args, **kwargs):
        with generation_on_torch_model(self):
            return super()._generate_single_turn(*args, **kwargs)
