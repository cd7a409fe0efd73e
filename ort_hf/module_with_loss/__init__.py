from .loss_choice import LossChoice, choose_loss
from .module_with_loss import (CROSS_ENTROPY, IGNORE_INDEX, LOSS_KINDS, MODEL_LOSS, USER_LOSS, LossInPyTorch, ModuleWithLoss,
                               base_model, missing_labels_error)

__all__ = ["CROSS_ENTROPY", "IGNORE_INDEX", "LOSS_KINDS", "MODEL_LOSS", "USER_LOSS", "LossChoice", "LossInPyTorch", "ModuleWithLoss",
           "base_model", "choose_loss", "missing_labels_error"]
