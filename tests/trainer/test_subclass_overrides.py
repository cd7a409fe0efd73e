"""ORTTrainerMixin under the other ways users write a Trainer subclass: an own ``training_step``
(calling ``super()`` or not), an own ``compute_loss`` in a class above the mixin, and a config whose
``__post_init__`` derives fields from others. Each trains as the plain subclass does, step for step,
with ORT proven to have run (fallback disabled, engine status ``ort``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from tiny_models import FAMILIES, build, rule_dataset, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.module_with_loss import ModuleWithLoss
from ort_hf.trainer import ORTTrainerMixin, ORTTrainingArguments
from ort_hf.trainer.parent_binding import as_ort_args, ort_args_class_for

STEPS = 3


def _weighted_loss(model, inputs, return_outputs=False):
    labels = inputs.pop("labels")
    outputs = model(**inputs)
    loss = torch.nn.functional.cross_entropy(outputs.logits, labels, weight=torch.tensor([1.0, 3.0]))
    return (loss, outputs) if return_outputs else loss


class StepThroughSuper(Trainer):
    """An own training_step that adds to the parent's (here: counts the steps)."""

    steps = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.steps += 1
        return super().training_step(model, inputs, num_items_in_batch)


class StepOfItsOwn(Trainer):
    """An own training_step that never calls super(): the model it is given, its own loss and backward."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        loss = _weighted_loss(model, dict(inputs))
        self.accelerator.backward(loss)
        return loss.detach()


class StepOnSelfModel(Trainer):
    """An own training_step that calls self.model: through ORT, PyTorch would train it unseen."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = _weighted_loss(self.model, dict(inputs))
        self.accelerator.backward(loss)
        return loss.detach()


class PlainMixed(ORTTrainerMixin, Trainer):
    pass


class LossAboveTheMixin(PlainMixed):
    """The user's class over an ORT trainer (``class X(MyORTTrainer)``), with its own loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return _weighted_loss(model, inputs, return_outputs)


class PlainWeighted(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return _weighted_loss(model, inputs, return_outputs)


def _losses(cls, args_cls, out, **extra) -> tuple[list[float], Trainer]:
    args = tiny_args(args_cls, out, max_steps=STEPS, per_device_train_batch_size=8, **extra)
    trainer = cls(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=rule_dataset(24))
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer


def _assert_ort_ran(trainer) -> None:
    assert trainer.args.ort_fallback == "disable" and trainer.ort_engine_status().backend == "ort"


@pytest.mark.parametrize("parent", [StepThroughSuper, StepOfItsOwn], ids=["calls-super", "own-step"])
def test_an_own_training_step_trains_through_ort_as_the_plain_subclass(tmp_path, parent):
    mixed = type(f"ORT{parent.__name__}", (ORTTrainerMixin, parent), {})
    plain, _ = _losses(parent, TrainingArguments, tmp_path / "plain")
    ours, trainer = _losses(mixed, ORTTrainingArguments, tmp_path / "ort")
    _assert_ort_ran(trainer)
    assert len(ours) == STEPS and ours == pytest.approx(plain, abs=1e-5)
    if parent is StepThroughSuper:  # the parent's step, so Trainer's loss: ModuleWithLoss keeps label sparsity
        assert trainer.steps == STEPS and isinstance(trainer._ort_run.loss_module, ModuleWithLoss)
    else:  # its own call of the model: the model's outputs, not ModuleWithLoss's
        assert trainer._ort_run.loss_module is None


def test_a_training_step_that_bypasses_the_ort_module_stops_at_step_1(tmp_path):
    mixed = type("ORTStepOnSelfModel", (ORTTrainerMixin, StepOnSelfModel), {})
    with pytest.raises(RuntimeError, match=r"StepOnSelfModel.training_step calls the plain model"):
        _losses(mixed, ORTTrainingArguments, tmp_path)


def test_a_compute_loss_above_the_mixin_is_the_loss_trained(tmp_path):
    plain, _ = _losses(PlainWeighted, TrainingArguments, tmp_path / "plain")
    ours, trainer = _losses(LossAboveTheMixin, ORTTrainingArguments, tmp_path / "ort")
    _assert_ort_ran(trainer)
    assert trainer._ort_run.loss_module is None  # not ModuleWithLoss's cross-entropy: the user's weighted one
    assert len(ours) == STEPS and ours == pytest.approx(plain, abs=1e-5)
    unweighted, _ = _losses(PlainMixed, ORTTrainingArguments, tmp_path / "unweighted")
    assert unweighted != pytest.approx(plain, abs=1e-3)  # the weights change the loss: the comparison can fail


@dataclass
class GroupConfig(TrainingArguments):
    """As GRPOConfig: ``group_rows`` and ``groups_per_step`` derive each other; both set is an error."""

    group_rows: int | None = field(default=None, metadata={"help": "Rows per group."})
    groups_per_step: int | None = field(default=None, metadata={"help": "Groups per step."})

    def __post_init__(self):
        super().__post_init__()
        if self.group_rows is not None and self.groups_per_step is not None:
            raise ValueError("group_rows and groups_per_step can not be both configured")
        if self.group_rows is None:
            self.group_rows = self.per_device_train_batch_size // (self.groups_per_step or 1)
        self.groups_per_step = self.per_device_train_batch_size // self.group_rows


class GroupTrainer(Trainer):
    def __init__(self, model, args: GroupConfig | None = None, **kwargs):
        super().__init__(model=model, args=args, **kwargs)


class ORTGroupTrainer(ORTTrainerMixin, GroupTrainer):
    pass


@pytest.mark.parametrize("given", [{}, {"group_rows": 2}, {"groups_per_step": 2}], ids=["neither", "rows", "groups"])
def test_a_configs_derived_fields_are_derived_again_not_passed_back(tmp_path, given):
    config = GroupConfig(
        output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=8, learning_rate=3e-4, **given
    )
    trainer = ORTGroupTrainer(build(FAMILIES["bert-cls"]), config, train_dataset=rule_dataset(8))
    assert type(trainer.args) is ort_args_class_for(GroupConfig)
    for name in ("group_rows", "groups_per_step", "learning_rate", "per_device_train_batch_size"):
        assert getattr(trainer.args, name) == getattr(config, name), name


@pytest.mark.parametrize(
    "given", [{}, {"steps_per_generation": 4}, {"generation_batch_size": 16}], ids=["default", "steps", "batch"]
)
def test_grpo_config_rebuilds_as_its_ort_config(tmp_path, given):
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        bf16=False,
        use_cpu=True,
        **given,
    )
    ours = as_ort_args(config, ort_args_class_for(trl.GRPOConfig), trl.GRPOConfig)
    assert isinstance(ours, trl.GRPOConfig) and isinstance(ours, ORTTrainingArguments)
    for name in ("generation_batch_size", "steps_per_generation", "num_generations", "per_device_train_batch_size"):
        assert getattr(ours, name) == getattr(config, name), name


def test_every_value_set_survives_the_rebuild(tmp_path):
    import dataclasses

    config = TrainingArguments(
        output_dir=str(tmp_path),
        report_to=[],
        learning_rate=3e-4,
        warmup_steps=7,
        lr_scheduler_type="cosine",
        gradient_accumulation_steps=3,
        logging_steps=5,
        save_strategy="no",
        eval_strategy="steps",
        eval_steps=11,
        seed=9,
        weight_decay=0.1,
        label_names=["y"],
        run_name="mine",
        max_grad_norm=0.5,
        use_cpu=True,
    )
    ours = as_ort_args(config, ORTTrainingArguments)
    differing = [
        f.name
        for f in dataclasses.fields(TrainingArguments)
        if f.init and getattr(ours, f.name) != getattr(config, f.name)
    ]
    assert differing == []
