"""ORTTrainer stays a narrow subclass: no copy of a Trainer loop method."""

from ort_hf.trainer.ort_trainer import ORTTrainer, ORTTrainerMixin

LOOP_METHODS = [
    "_inner_training_loop",
    "_run_epoch",
    "training_step",
    "evaluation_loop",
    "prediction_step",
    "_prepare_for_training",
    "_maybe_log_save_evaluate",
    "_save_checkpoint",
    "_load_from_checkpoint",
]


def test_no_loop_method_is_overridden():
    assert ORTTrainer.__mro__[1] is ORTTrainerMixin  # the hooks live in the mixin
    overridden = [m for m in LOOP_METHODS if m in ORTTrainerMixin.__dict__]
    assert not overridden, f"ORTTrainer overrides loop methods {overridden}"
