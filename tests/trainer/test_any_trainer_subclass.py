"""ORTTrainerMixin mixed into a Trainer subclass with its own parameter order and its own config
class (the shapes of TRL's DPOTrainer and SFTTrainer), without TRL: arguments reach the parent's
parameters by name, and the parent gets its own config class with the ORT options added."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest
from tiny_models import FAMILIES, build, rule_dataset
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainerMixin, ORTTrainingArguments
from ort_hf.trainer.parent_binding import ort_args_class_for


@dataclass
class RecipeConfig(TrainingArguments):
    beta: float = field(default=0.1, metadata={"help": "A recipe's own option."})


class RecipeTrainer(Trainer):
    """As DPOTrainer: a second positional parameter before ``args``, and any other arguments class
    rebuilt as its own (which would drop ORT's options)."""

    def __init__(self, model, ref_model=None, args: RecipeConfig | TrainingArguments | None = None, **kwargs):
        if args is not None and not isinstance(args, RecipeConfig):
            args = RecipeConfig(**{k: v for k, v in args.to_dict().items() if k in RecipeConfig.__dataclass_fields__})
        self.ref_model = ref_model
        super().__init__(model=model, args=args, **kwargs)


class ORTRecipeTrainer(ORTTrainerMixin, RecipeTrainer):
    pass


def _make(tmp_path, *args, **kwargs):
    return ORTRecipeTrainer(*args, train_dataset=rule_dataset(8), **kwargs)


def test_positional_arguments_reach_the_parents_own_parameters(tmp_path):
    model, ref = build(FAMILIES["bert-cls"]), build(FAMILIES["bert-cls"])
    config = RecipeConfig(output_dir=str(tmp_path), beta=0.3, report_to=[])
    trainer = _make(tmp_path, model, ref, config)  # DPOTrainer(model, ref_model, args) order
    assert trainer.ref_model is ref and trainer.model is model
    assert isinstance(trainer.args, RecipeConfig) and isinstance(trainer.args, ORTTrainingArguments)
    assert trainer.args.beta == 0.3 and trainer.args.ort_fallback == "auto"


@pytest.mark.parametrize("given", ["recipe", "plain", "ort", "none"])
def test_the_parent_gets_its_own_config_class_with_the_ort_options(tmp_path, given):
    common = dict(output_dir=str(tmp_path), report_to=[], learning_rate=3e-4)
    args = {
        "recipe": lambda: RecipeConfig(beta=0.5, **common),
        "plain": lambda: TrainingArguments(**common),
        "ort": lambda: ORTTrainingArguments(ort_fallback="disable", **common),
        "none": lambda: None,
    }[given]()
    trainer = _make(tmp_path, build(FAMILIES["bert-cls"]), args=args)
    assert type(trainer.args) is ort_args_class_for(RecipeConfig)
    assert trainer.args.beta == (0.5 if given == "recipe" else 0.1)
    if given != "none":
        assert trainer.args.learning_rate == 3e-4  # every value given is kept
    assert trainer.args.ort_fallback == ("disable" if given == "ort" else "auto")
    assert pickle.loads(pickle.dumps(trainer.args)).beta == trainer.args.beta  # the Trainer saves its args


def test_a_wrong_call_gets_the_parents_own_error(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such'"):
        ORTRecipeTrainer(build(FAMILIES["bert-cls"]), no_such=1)


def test_plain_trainer_keeps_its_named_classes():
    from transformers import Seq2SeqTrainingArguments

    from ort_hf.trainer import ORTSeq2SeqTrainingArguments

    assert ort_args_class_for(TrainingArguments) is ORTTrainingArguments
    assert ort_args_class_for(Seq2SeqTrainingArguments) is ORTSeq2SeqTrainingArguments
    with pytest.raises(TypeError, match="not a TrainingArguments"):
        ort_args_class_for(dict)


class WeightedTrainer(Trainer):
    """A user's own loss from the model's outputs (class weights), the common Trainer override."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels, weight=torch.tensor([1.0, 3.0]))
        return (loss, outputs) if return_outputs else loss


class ORTWeightedTrainer(ORTTrainerMixin, WeightedTrainer):
    pass


def test_a_parents_own_compute_loss_trains_through_ort_with_its_loss(tmp_path):
    from tiny_models import tiny_args

    losses = {}
    for name, cls, args_cls in (
        ("plain", WeightedTrainer, TrainingArguments),
        ("ort", ORTWeightedTrainer, ORTTrainingArguments),
    ):
        extra = {"ort_fallback": "disable"} if name == "ort" else {}
        args = tiny_args(
            args_cls, tmp_path / name, max_steps=3, per_device_train_batch_size=8, logging_steps=1, **extra
        )
        trainer = cls(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=rule_dataset(24))
        trainer.train()
        losses[name] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.ort_engine_status().backend == "ort" and trainer._ort_run.loss_module is None
    assert losses["ort"] == pytest.approx(losses["plain"], abs=1e-5)


class PassingOnTrainer(Trainer):
    """The common way a user's trainer takes an option of its own and passes the rest on."""

    def __init__(self, *args, class_weights=None, **kwargs):
        self.class_weights = class_weights
        super().__init__(*args, **kwargs)


class ORTPassingOnTrainer(ORTTrainerMixin, PassingOnTrainer):
    pass


@pytest.mark.parametrize("positional", [True, False])
def test_a_parent_that_passes_args_on_gets_its_own_options_and_an_ort_config(tmp_path, positional):
    model, args = (
        build(FAMILIES["bert-cls"]),
        TrainingArguments(output_dir=str(tmp_path), report_to=[], learning_rate=2e-4),
    )
    call = ((model, args), {}) if positional else ((), {"model": model, "args": args})
    trainer = ORTPassingOnTrainer(*call[0], **call[1], train_dataset=rule_dataset(8), class_weights=[1.0, 3.0])
    assert trainer.class_weights == [1.0, 3.0] and trainer.model is model
    assert isinstance(trainer.args, ORTTrainingArguments) and trainer.args.learning_rate == 2e-4


@dataclass
class MyRecipeConfig(ORTTrainingArguments, RecipeConfig):
    """The documented pattern for naming one's own ORT config (README)."""


def test_a_users_own_ort_config_is_handed_over_as_given(tmp_path):
    args = MyRecipeConfig(output_dir=str(tmp_path), report_to=[], beta=0.7, ort_fallback="disable")
    trainer = _make(tmp_path, build(FAMILIES["bert-cls"]), args=args)
    assert trainer.args is args and trainer.args.beta == 0.7
