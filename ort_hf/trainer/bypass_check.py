"""Stops a run whose first training step never reached the ORT module.

A ``training_step`` override (or a ``compute_loss`` one) that calls ``self.model`` instead of the
``model`` it is given trains the plain PyTorch model: the ORT module shares its weights, so nothing
fails, and the run would silently not be an ORT run. Which model an override calls is not knowable
before it runs, so this is checked at the end of the first optimizer step.
"""

from __future__ import annotations

import weakref

from transformers import TrainerCallback


class EngineBypassCheck(TrainerCallback):
    """Raises at the end of the first optimizer step if the trainer's ORT module never ran."""

    def __init__(self, trainer, overrides: str):
        self._trainer, self._overrides = weakref.ref(trainer), overrides

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self._trainer()
        engine = trainer.ort_engine if trainer is not None else None
        if engine is None or engine.engine_status().backend != "not_run":
            return
        raise RuntimeError(
            f"ort_hf: step {state.global_step} of training never called the ORT module: {self._overrides} calls the "
            "plain model (self.model?) rather than the `model` argument it is given, so PyTorch trained it. Call "
            "`model(...)` or `self.compute_loss(model, inputs)` with the `model` training_step receives, or train "
            "with use_ort=False."
        )
