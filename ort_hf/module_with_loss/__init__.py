from .module_with_loss import ModuleWithLoss

__all__ = ["ModuleWithLoss"]
