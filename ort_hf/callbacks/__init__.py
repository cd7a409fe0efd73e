"""TrainerCallbacks whose numbers land in the Trainer's logs; they work under plain Trainer too."""

from .density import InputDensityCallback
from .memory import MemoryObserverCallback
from .observer import BatchObserver

__all__ = ["BatchObserver", "InputDensityCallback", "MemoryObserverCallback"]
