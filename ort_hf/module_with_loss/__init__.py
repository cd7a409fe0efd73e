from .loss_choice import LossChoice, choose_loss
from .module_with_loss import (CROSS_ENTROPY, LOSS_KINDS, MODEL_LOSS, USER_LOSS, LossInPyTorch, ModuleWithLoss,
                               missing_labels_error)

__all__ = ["CROSS_ENTROPY", "LOSS_KINDS", "MODEL_LOSS", "USER_LOSS", "LossChoice", "LossInPyTorch", "ModuleWithLoss",
           "choose_loss", "missing_labels_error"]
