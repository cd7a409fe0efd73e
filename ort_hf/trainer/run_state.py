"""What an ORTTrainer keeps between hooks: the engine it trains through and the flags that say
which one-time work is still due."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class ORTRunState:
    """Created with the trainer; ``train()`` calls :meth:`start_train_call`. The engine and the
    modules around it outlive a ``train()`` call: a later call on the same model and options
    trains on the same session, with no re-export."""

    engine: Any = None  # the ORTTrainingModule of the current train() attempt
    train_model: nn.Module | None = None  # what _wrap_model returned: the engine, or DDP / DeepSpeed around it
    # Inside the engine: ModuleWithLoss, or FusedLMHeadModule for TRL's fused head; None: the plain model.
    loss_module: nn.Module | None = None
    head_caller: Any = None  # the FusedHeadCaller TRL's compute_loss called last (its label density)
    eval_engine: Any = None  # the inference engine of --ort_eval_in_ort
    # The next _wrap_model starts a train() call, which may reuse the engine (a retry of
    # auto_find_batch_size in the same call builds a new one).
    new_train_call: bool = False
    # Set when an engine is built. Its first step places the loss before the forward (in the graph
    # or in PyTorch: it decides what ORT exports) and records the graph's facts after it.
    first_step_due: bool = False
    # The graph's one-time facts go into the run's first log; not in a run resumed from a
    # checkpoint, so its log history is the uninterrupted run's.
    facts_due: bool = True
    pending_logs: dict[str, float] = field(default_factory=dict)  # for the next training log, once

    def start_train_call(self, resumed: bool) -> None:
        self.new_train_call = True
        self.facts_due = not resumed
