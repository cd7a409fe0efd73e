"""ORTDPOTrainer against DPOTrainer from the same seed (sigmoid loss): per-step loss and the
rewards/*, logps/*, logits/*, entropy and accuracy logs within 1e-4 over 8 steps, full fine-tune
(a separate reference model) and LoRA (the adapter-disabled policy as reference), with ORT proven
to have trained the policy on the used rows only."""

from __future__ import annotations

import pytest
from datasets import Dataset

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")

from trl_runs import assert_same_run, build_model, build_tokenizer, common_args, lora_config  # noqa: E402

from ort_hf.trl import ORTDPOConfig, ORTDPOTrainer  # noqa: E402

ROWS = 32
KEYS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "entropy",
    "mean_token_accuracy",
    "num_tokens",
)


def _data() -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"What is {i} plus {i + 1}?" for i in range(ROWS)],
            "chosen": [f" It is {2 * i + 1}." for i in range(ROWS)],
            "rejected": [f" Maybe {3 * i}, or so." for i in range(ROWS)],
        }
    )


def _train(lora: bool, out, ort: bool):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    # The policy starts away from its reference (another seed; LoRA: random B, TRL disables the adapter for
    # the reference). Started equal, every reward is 0 up to float noise at step 1, and rewards/accuracies
    # (the share of chosen > rejected) would compare noise, in either engine.
    ref_model = None if lora else build_model(tokenizer, seed=1)
    args = common_args(out, lora, loss_type="sigmoid", beta=0.1)
    peft_config = lora_config(init_lora_weights=False) if lora else None
    if ort:
        config = ORTDPOConfig(ort_fallback="disable", ort_log_level="ERROR", **args)
        # positionally, in DPOTrainer's order (model, ref_model, args)
        trainer = ORTDPOTrainer(
            model, ref_model, config, train_dataset=_data(), processing_class=tokenizer, peft_config=peft_config
        )
    else:
        trainer = trl.DPOTrainer(
            model,
            ref_model,
            trl.DPOConfig(**args),
            train_dataset=_data(),
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    trainer.train()
    return trainer


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dpo_through_ort_equals_dpo_trainer(lora, tmp_path):
    reference = _train(lora, tmp_path / "pt", ort=False)
    trainer = _train(lora, tmp_path / "ort", ort=True)
    assert_same_run(reference, trainer, KEYS)
