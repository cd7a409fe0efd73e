"""Where the callbacks see each batch: forward hooks on the module the Trainer calls.

TrainerCallback events carry no batch. The module that receives ``model(**inputs)`` does:
under plain ``Trainer`` that is the model itself; under ``ORTTrainer`` it is the engine
module (ORT runs the HF model's forward as a graph, so hooks on the HF model never fire),
which ``ORTTrainer`` hands to every :class:`BatchObserver` via :meth:`observe`.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


class BatchObserver(TrainerCallback):
    """Base for callbacks that look at each forward's keyword inputs (and its end)."""

    def __init__(self) -> None:
        self._handles: list = []
        self._observed: torch.nn.Module | None = None
        self._collected_step = -1

    def observe(self, module: torch.nn.Module) -> None:
        """Hook ``module``'s forward; replaces any earlier hooks of this callback."""
        self.release()
        self._observed = module
        self._handles = [
            module.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
            module.register_forward_hook(self._post_hook, with_kwargs=True),
        ]

    def release(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._observed = [], None

    def _pre_hook(self, module, args, kwargs):
        if module.training:
            self.before_forward(kwargs)

    def _post_hook(self, module, args, kwargs, output):
        if module.training:
            self.after_forward()

    # subclasses override
    def before_forward(self, inputs: dict) -> None:
        pass

    def after_forward(self) -> None:
        pass

    def collect(self, args, state, logs: dict) -> dict:
        """Metrics of the logging window that just closed (then reset the window)."""
        return {}

    def merge_into(self, args, state, logs: dict | None) -> dict:
        """Add this window's metrics to a training log entry, once per step."""
        if logs is None or "loss" not in logs or self._collected_step == state.global_step:
            return {}
        metrics = self.collect(args, state, logs)
        self._collected_step = state.global_step
        logs.update(metrics)
        return metrics

    def on_log(self, args, state, control, logs=None, **kwargs):
        # ORTTrainer.log merges before the parent logs, so the values reach every reporting
        # integration; under plain Trainer they are added here, to the logs and to the entry
        # the Trainer just appended to state.log_history (trainer_state.json).
        metrics = self.merge_into(args, state, logs)
        if metrics and state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._collected_step = -1
        if self._observed is None and model is not None:
            self.observe(model)

    def on_train_end(self, args, state, control, **kwargs):
        self.release()


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum ``values`` over ranks when torch.distributed is up (every rank must call it)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        tensor = tensor.cuda()
    torch.distributed.all_reduce(tensor)
    return tensor.cpu().tolist()
