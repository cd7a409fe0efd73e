"""Dropout masks in the ORT graph are a function of the optimizer step on every training path: a run
resumed from a checkpoint ends with the weights of the uninterrupted run, with ModuleWithLoss on and
off, with a subclass whose compute_loss never calls the parent's, with the mixin over a user's own
Trainer subclass, and in a wrap_model user's loop that calls seed_steps."""

import copy

import pytest
import torch
from tiny_models import FAMILIES, build, make_batch, rule_dataset, tiny_args
from transformers import Trainer

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.trainer import ORTTrainer, ORTTrainerMixin, ORTTrainingArguments


class OwnLossTrainer(ORTTrainer):
    """The common user override: the loss from the model's outputs, no call to the parent's compute_loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        logits = model(**inputs).logits
        return torch.nn.functional.cross_entropy(logits, labels)


class WeightedTrainer(Trainer):
    """A user's own Trainer subclass (its loss from the logits), with ORT mixed in below."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        weight = torch.tensor([1.0, 2.0])
        return torch.nn.functional.cross_entropy(model(**inputs).logits, labels, weight=weight)


class ORTWeightedTrainer(ORTTrainerMixin, WeightedTrainer):
    pass


def _train(trainer_cls, out, resume=None, module_with_loss=False):
    model = build(FAMILIES["bert-cls"], dropout=0.2)
    args = tiny_args(
        ORTTrainingArguments,
        out,
        max_steps=4,
        save_steps=2,
        save_strategy="steps",
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        use_module_with_loss=module_with_loss,
    )
    trainer = trainer_cls(model=model, args=args, train_dataset=rule_dataset(32))
    trainer.train(resume_from_checkpoint=resume)
    assert trainer.ort_engine_status().backend == "ort"
    nodes = trainer.ort_engine.training_graph().graph.node
    assert any(a.s == b"ort_hf::cpu_dropout" for n in nodes if n.op_type == "ATen" for a in n.attribute)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    "trainer_cls, module_with_loss",
    [(ORTTrainer, True), (ORTTrainer, False), (OwnLossTrainer, False), (ORTWeightedTrainer, False)],
    ids=["module-with-loss", "model-loss", "own-compute-loss", "mixin-over-own-trainer"],
)
def test_resumed_run_draws_the_uninterrupted_masks(trainer_cls, module_with_loss, tmp_path):
    full = _train(trainer_cls, tmp_path / "full", module_with_loss=module_with_loss)
    resumed = _train(
        trainer_cls,
        tmp_path / "resumed",
        resume=str(tmp_path / "full" / "checkpoint-2"),
        module_with_loss=module_with_loss,
    )
    worst = max(float((full[n] - resumed[n]).abs().max()) for n in full)
    assert worst <= 1e-6, f"resumed weights differ by {worst:.1e}: other dropout masks"


def _loop(model, steps, seeded: bool, state=None):
    """A wrap_model user's loop from ``steps[0]``; returns the weights and the optimizer's state."""
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR", preflight="never"))
    wrapped.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if state is not None:
        opt.load_state_dict(state)
    for step in steps:
        if seeded:
            wrapped.seed_steps(0, step)
        wrapped(**make_batch("cls", torch.Generator().manual_seed(step))).loss.backward()
        opt.step()
        opt.zero_grad()
    assert wrapped.engine_status().backend == "ort"
    return model, copy.deepcopy(opt.state_dict())


@pytest.mark.parametrize("seeded", [True, False])
def test_a_wrap_model_loop_that_calls_seed_steps_resumes_with_the_same_masks(seeded):
    full, _ = _loop(build(FAMILIES["bert-cls"], dropout=0.2), range(4), seeded)
    half, state = _loop(build(FAMILIES["bert-cls"], dropout=0.2), range(2), seeded)
    resumed, _ = _loop(copy.deepcopy(half), range(2, 4), seeded, state)  # a new session, as after a restart
    worst = max(float((a - b).abs().max()) for a, b in zip(full.parameters(), resumed.parameters()))
    if seeded:
        assert worst <= 1e-6, f"resumed weights differ by {worst:.1e}: other dropout masks"
    else:  # without the call the masks come from one process-wide stream: the runs part
        assert worst > 1e-4
