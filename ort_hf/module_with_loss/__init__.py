"""ModuleWithLoss: a model and its loss as one module, so ORT exports the loss into its graph.

The public names; what the trainer uses besides (the first-batch loss choice, the loss in PyTorch)
is imported from ``loss_choice`` and ``module_with_loss``.
"""

from .module_with_loss import IGNORE_INDEX, LOSS_KINDS, ModuleWithLoss

__all__ = ["IGNORE_INDEX", "LOSS_KINDS", "ModuleWithLoss"]
