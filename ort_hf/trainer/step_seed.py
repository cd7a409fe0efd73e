"""Dropout masks inside the ORT graph, seeded from the optimizer step on every training path."""

from __future__ import annotations

import weakref

from transformers import TrainerCallback


class StepSeedCallback(TrainerCallback):
    """At each optimizer step, has the trainer's ORT module seed its graph's generators from
    ``(args.seed, global step)`` (``ORTTrainingModule.seed_steps``).

    ORT's generators and ort_hf's dropout kernels are not part of torch's RNG state, which is all a
    checkpoint restores; seeded from the step, a resumed run draws the masks an uninterrupted one
    drew. A callback rather than a line in ``compute_loss`` or ``training_step``: it runs whichever
    of those a ``Trainer`` subclass overrides, with or without ModuleWithLoss."""

    def __init__(self, trainer):
        self._trainer = weakref.ref(trainer)

    def on_step_begin(self, args, state, control, **kwargs):
        trainer = self._trainer()
        engine = trainer.ort_engine if trainer is not None else None
        if engine is not None:
            engine.seed_steps(args.seed, state.global_step)
