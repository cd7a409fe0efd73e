"""ORTRewardTrainer against RewardTrainer from the same seed: per-step loss (Bradley-Terry, with
``center_rewards_coefficient``) and the accuracy / margin / reward logs within 1e-4 over 8 steps,
full fine-tune and LoRA, on a tiny Qwen2 sequence-classification model (one reward per row) built in
code, with ORT proven to have trained (fallback disabled, engine status ``ort``)."""

from __future__ import annotations

import pytest
import torch
import transformers
from datasets import Dataset

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
peft = pytest.importorskip("peft", reason="peft is not installed")

from trl_runs import assert_same_logs, build_tokenizer, common_args, logged, weights  # noqa: E402

from ort_hf.trl import ORTRewardConfig, ORTRewardTrainer  # noqa: E402

ROWS = 32
KEYS = ("loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward", "num_tokens")


def _data() -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"What is {i} plus {i + 1}?" for i in range(ROWS)],
            "chosen": [f" It is {2 * i + 1}." for i in range(ROWS)],
            "rejected": [f" Maybe {3 * i}, or so." for i in range(ROWS)],
        }
    )


def _reward_model(tokenizer, seed: int = 0):
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        num_labels=1,
    )
    torch.manual_seed(seed)
    return transformers.Qwen2ForSequenceClassification(config)


def _train(lora: bool, out, ort: bool):
    tokenizer = build_tokenizer()
    args = common_args(out, lora, center_rewards_coefficient=None if lora else 0.01)
    peft_config = (
        peft.LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "v_proj"],
            task_type="SEQ_CLS",
            init_lora_weights=False,
        )
        if lora
        else None
    )
    config = ORTRewardConfig(ort_fallback="disable", ort_log_level="ERROR", **args) if ort else trl.RewardConfig(**args)
    cls = ORTRewardTrainer if ort else trl.RewardTrainer
    trainer = cls(
        _reward_model(tokenizer), config, train_dataset=_data(), processing_class=tokenizer, peft_config=peft_config
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("lora", [False, True], ids=["full-centered", "lora"])
def test_reward_modelling_through_ort_equals_reward_trainer(lora, tmp_path):
    reference = _train(lora, tmp_path / "pt", ort=False)
    trainer = _train(lora, tmp_path / "ort", ort=True)
    status = trainer.ort_engine_status()
    assert status.backend == "ort" and trainer.args.ort_fallback == "disable", status
    ours, theirs = logged(trainer, KEYS), logged(reference, KEYS)
    assert_same_logs(theirs, ours)
    assert len({row["accuracy"] for row in theirs}) > 1  # the accuracy moves: its comparison can fail
    ours_w, theirs_w = weights(trainer.model), weights(reference.model)
    for key, value in theirs_w.items():
        torch.testing.assert_close(ours_w[key], value, rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")
