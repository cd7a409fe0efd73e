"""ORTKTOTrainer against KTOTrainer from the same seed (loss_type "kto", with the KL estimate):
per-step loss, kl and the rewards/*, logps/*, logits/* logs within 1e-4 over 8 steps, full
fine-tune (a separate reference model) and LoRA (the adapter-disabled policy as reference), with
ORT proven to have trained the policy on the used rows only."""

from __future__ import annotations

import pytest
from datasets import Dataset

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")

from trl_runs import assert_same_run, build_model, build_tokenizer, common_args, lora_config  # noqa: E402

from ort_hf.trl import ORTKTOConfig, ORTKTOTrainer  # noqa: E402

ROWS = 32
KEYS = (
    "loss",
    "kl",
    "rewards/chosen",
    "rewards/rejected",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "num_tokens",
)


def _data() -> Dataset:
    # Unpaired: each prompt has one completion, desirable or not; every batch of 4 holds both kinds.
    good = [i % 2 == 0 for i in range(ROWS)]
    return Dataset.from_dict(
        {
            "prompt": [f"What is {i} plus {i + 1}?" for i in range(ROWS)],
            "completion": [f" It is {2 * i + 1}." if g else f" Maybe {3 * i}, or so." for i, g in enumerate(good)],
            "label": good,
        }
    )


def _train(lora: bool, out, ort: bool):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    # The policy starts away from its reference (another seed; LoRA: random B), as in test_dpo.py:
    # started equal, every reward and the KL estimate are zero up to float noise at step 1.
    ref_model = None if lora else build_model(tokenizer, seed=1)
    args = common_args(out, lora, loss_type="kto", beta=0.1, train_sampling_strategy="sequential")
    peft_config = lora_config(init_lora_weights=False) if lora else None
    if ort:
        config = ORTKTOConfig(ort_fallback="disable", ort_log_level="ERROR", **args)
        trainer = ORTKTOTrainer(
            model, ref_model, config, train_dataset=_data(), processing_class=tokenizer, peft_config=peft_config
        )
    else:
        trainer = trl.KTOTrainer(
            model,
            ref_model,
            trl.KTOConfig(**args),
            train_dataset=_data(),
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    trainer.train()
    return trainer


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_kto_through_ort_equals_kto_trainer(lora, tmp_path):
    reference = _train(lora, tmp_path / "pt", ort=False)
    assert any(h.get("kl", 0) > 0 for h in reference.state.log_history)  # the KL estimate is compared, not zeros
    trainer = _train(lora, tmp_path / "ort", ort=True)
    assert_same_run(reference, trainer, KEYS)
    # One export: the KL estimate's no-grad forward ran TRL's head in PyTorch (through the engine, ORT would
    # export its inference graph as well: 2).
    assert trainer.ort_engine_status().export_count == 1
