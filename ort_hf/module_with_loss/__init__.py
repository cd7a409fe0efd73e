from .module_with_loss import ModuleWithLoss, missing_labels_error

__all__ = ["ModuleWithLoss", "missing_labels_error"]
