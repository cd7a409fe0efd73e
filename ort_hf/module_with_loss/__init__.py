"""ModuleWithLoss: a model and its loss as one module, so ORT exports the loss into its graph.

The public names; what the trainer uses besides (the first-batch loss choice, the loss in PyTorch,
TRL's fused LM head as a module ORT exports) is imported from ``loss_choice``, ``module_with_loss``
and ``fused_lm_head``.
"""

from .module_with_loss import IGNORE_INDEX, LOSS_KINDS, ModuleWithLoss

__all__ = ["IGNORE_INDEX", "LOSS_KINDS", "ModuleWithLoss"]
