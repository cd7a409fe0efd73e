"""``ORTRewardTrainer`` / ``ORTRewardConfig``: TRL's reward modelling with ORTTrainer's hooks.

The sequence-classification model's forward and backward run in an ORT session; TRL's
``compute_loss`` stays TRL's (the mixin keeps a parent's own loss): it calls the ORT module on the
chosen and rejected rows, turns the rewards into its Bradley-Terry loss (with ``margin`` and
``center_rewards_coefficient``) and logs ``accuracy``, ``margin`` and the reward statistics.
"""

from __future__ import annotations

from trl import RewardTrainer

from ..trainer.ort_trainer import ORTTrainerMixin
from .configs import ORTRewardConfig


class ORTRewardTrainer(ORTTrainerMixin, RewardTrainer):
    """Drop-in ``RewardTrainer`` whose training steps (the reward model's forward and backward) run in
    an ORT session; the loss and the logs are TRL's, from the rewards ORT computed."""

    ort_args_class = ORTRewardConfig
