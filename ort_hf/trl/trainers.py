"""``ORTSFTTrainer`` and ``ORTDPOTrainer``: TRL's trainers with ORTTrainer's hooks.

TRL's ``compute_loss`` stays TRL's: it calls the model with ``fused_lm_head=True`` and builds its
loss and metrics from the per-token outputs. Through ORT that call runs ``FusedLMHeadModule``
(the backbone, the vocabulary projection on the non-ignored rows and the per-token statistics,
in one ORT graph). What the mixin does for any trainer with TRL's fused head is in
``ORTTrainerMixin``; what is here is only what these two trainers do differently.
"""

from __future__ import annotations

from trl import DPOTrainer, SFTTrainer

from ..trainer.ort_trainer import ORTTrainerMixin
from .configs import ORTDPOConfig, ORTSFTConfig


class ORTSFTTrainer(ORTTrainerMixin, SFTTrainer):
    """Drop-in ``SFTTrainer`` whose training steps run in an ORT session.

    The model's forward, the LM head (on the positions whose labels count) and the per-token
    log-probabilities, entropy and top-1 flags TRL's loss and metrics read run inside the ORT graph.
    Refused before training: ``label_smoothing_factor`` and ``compute_loss_func`` (TRL computes them
    from the full logits of a second forward, deprecated in TRL)."""

    ort_args_class = ORTSFTConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.use_ort and (self.args.label_smoothing_factor or self.compute_loss_func is not None):
            option = "label_smoothing_factor" if self.args.label_smoothing_factor else "compute_loss_func"
            raise ValueError(
                f"{option} with ORTSFTTrainer: SFTTrainer computes it from the full logits of an extra "
                "forward next to its fused LM head (deprecated in TRL 1.x), which ORT cannot run as one "
                f"graph. Drop {option} (TRL's default loss, or loss_type='dft', trains through ORT), or "
                "train in PyTorch with use_ort=False."
            )


class ORTDPOTrainer(ORTTrainerMixin, DPOTrainer):
    """Drop-in ``DPOTrainer`` whose policy forward and backward run in an ORT session.

    The reference log-probabilities are computed in PyTorch, by TRL, under ``no_grad``: from
    ``ref_model``, or for a PEFT policy from the same model with its adapter disabled (TRL's
    ``use_adapter``), which then shares its weights with the ORT session. A reference forward
    has no backward, and TRL's tiled head already avoids the full logits, so an ORT inference
    session would add an export for no gain in memory."""

    ort_args_class = ORTDPOConfig
