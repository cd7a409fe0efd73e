"""ORTGRPOTrainer / ORTRLOOTrainer: what ORT cannot run is refused when the config or the trainer is built, saying what to
write instead; a plain GRPOConfig / RLOOConfig (whose __post_init__ derived one batch field from
the other) is taken as it is."""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")

from online_runs import LetterReward, prompts  # noqa: E402
from trl_runs import build_model, build_tokenizer, common_args  # noqa: E402

from ort_hf.trl import ORTGRPOConfig, ORTGRPOTrainer, ORTRLOOConfig, ORTRLOOTrainer  # noqa: E402

TRAINERS = {
    "grpo": (ORTGRPOConfig, ORTGRPOTrainer, trl.GRPOConfig),
    "rloo": (ORTRLOOConfig, ORTRLOOTrainer, trl.RLOOConfig),
}


def _build(trainer_cls, config):
    tokenizer = build_tokenizer()
    return trainer_cls(
        build_model(tokenizer), LetterReward(), config, train_dataset=prompts(), processing_class=tokenizer
    )


@pytest.mark.parametrize("kind", list(TRAINERS))
@pytest.mark.parametrize(
    ("option", "says"),
    [({"use_vllm": True}, "Pass use_vllm=False"), ({"use_liger_kernel": True}, "Drop use_liger_kernel")],
)
def test_refused_before_training(kind, option, says, tmp_path):
    config_cls, trainer_cls, trl_config_cls = TRAINERS[kind]
    with pytest.raises(ValueError, match=says):  # the ORT config refuses it
        config_cls(**common_args(tmp_path, False, num_generations=2, beta=0.0, **option))
    plain = trl_config_cls(**common_args(tmp_path, False, num_generations=2, beta=0.0, **option))
    with pytest.raises(ValueError, match=says):  # TRL's own config, rebuilt by the trainer, before TRL's __init__
        _build(trainer_cls, plain)


@pytest.mark.parametrize(
    ("kind", "given"), [("grpo", {"steps_per_generation": 2}), ("rloo", {"generation_batch_size": 8})]
)
def test_plain_trl_config_is_taken(kind, given, tmp_path):
    config_cls, trainer_cls, trl_config_cls = TRAINERS[kind]
    trainer = _build(trainer_cls, trl_config_cls(**common_args(tmp_path, False, num_generations=2, beta=0.0, **given)))
    assert isinstance(trainer.args, config_cls)
    assert (trainer.args.steps_per_generation, trainer.args.generation_batch_size) == (2, 8)
