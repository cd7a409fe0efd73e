"""ORTTrainer computes Trainer.compute_loss's loss in the engine and applies the parent's handling
of that loss itself (ort_hf.engine.compat.loss_as_trainer_returns): the two must agree on every
combination that decides it, for the installed transformers."""

from __future__ import annotations

import itertools
import types

import pytest
import torch
from transformers import Trainer

from ort_hf.engine import loss_as_trainer_returns


def _focal(outputs, labels, num_items_in_batch=None):
    return outputs["loss"]


def _fake_trainer(average, accepts_kwargs, loss_func, n_gpu, processes, tp):
    return types.SimpleNamespace(
        args=types.SimpleNamespace(average_tokens_across_devices=average, n_gpu=n_gpu),
        accelerator=types.SimpleNamespace(num_processes=processes, parallelism_config=None),
        get_tp_size=lambda: tp,
        label_smoother=None,
        compute_loss_func=loss_func,
        model_accepts_loss_kwargs=accepts_kwargs,
    )


@pytest.mark.parametrize(
    "average,accepts_kwargs,loss_func,num_items,n_gpu,processes,tp",
    list(itertools.product([True, False], [True, False], [None, _focal], [None, 7], [1, 2], [4], [1, 2])),
)
def test_the_loss_is_handled_as_trainer_compute_loss_handles_it(
    average, accepts_kwargs, loss_func, num_items, n_gpu, processes, tp
):
    trainer = _fake_trainer(average, accepts_kwargs, loss_func, n_gpu, processes, tp)

    def model(**inputs):
        return {"loss": torch.tensor(1.5)}

    parents = Trainer.compute_loss(trainer, model, {"input_ids": torch.ones(1, 2)}, num_items_in_batch=num_items)
    assert loss_as_trainer_returns(trainer, torch.tensor(1.5), num_items) == parents
