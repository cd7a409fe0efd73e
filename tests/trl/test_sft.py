"""ORTSFTTrainer against SFTTrainer from the same seed: per-step loss and TRL's logged metrics
(entropy, mean_token_accuracy, num_tokens) within 1e-4 over 8 steps, final weights alike, ORT
proven to have trained (fallback disabled) with the vocabulary projection on the used rows only
(read from ORT's graph)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")
pytest.importorskip("peft", reason="peft is not installed")

from trl_runs import assert_same_run, build_model, build_tokenizer, common_args, lora_config, weights  # noqa: E402

from ort_hf.trl import ORTSFTConfig, ORTSFTTrainer  # noqa: E402

ROWS = 32
KEYS = ("loss", "entropy", "mean_token_accuracy", "num_tokens")


def _data(kind: str) -> Dataset:
    if kind == "prompt-completion":  # completion-only loss (TRL's default for this format)
        return Dataset.from_dict(
            {
                "prompt": [f"What is {i} plus {i + 1}?" for i in range(ROWS)],
                "completion": [f" It is {2 * i + 1}." for i in range(ROWS)],
            }
        )
    if kind == "conversational":  # through the chat template, assistant turns only
        return Dataset.from_dict(
            {
                "messages": [
                    [
                        {"role": "user", "content": f"Add {i} and {i + 1}."},
                        {"role": "assistant", "content": f"{2 * i + 1}"},
                        {"role": "user", "content": "Thanks"},
                        {"role": "assistant", "content": "You are welcome."},
                    ]
                    for i in range(ROWS)
                ]
            }
        )
    return Dataset.from_dict({"text": [f"Number {i} is followed by {i + 1}." for i in range(ROWS)]})  # packed


# name -> (data, LoRA, SFTConfig options, model family). Gemma2: tied embeddings, final-logit soft-capping
# (read from TRL's head into ORT's graph), a sliding window shorter than the rows; GPT-2: Conv1D, tied.
CONFIGS = {
    "full-completion-only": ("prompt-completion", False, {}, "qwen2"),
    "lora-completion-only": ("prompt-completion", True, {}, "qwen2"),
    "lora-assistant-only-chat": ("conversational", True, {"assistant_only_loss": True}, "qwen2"),
    "lora-assistant-only-chat-gemma2": ("conversational", True, {"assistant_only_loss": True}, "gemma2"),
    "full-assistant-only-chat-gpt2": ("conversational", False, {"assistant_only_loss": True}, "gpt2"),
    "full-packing-padding-free": ("text", False, {"packing": True, "max_length": 64}, "qwen2"),
}


def _train(name: str, out, ort: bool):
    kind, lora, extra, family = CONFIGS[name]
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, family=family)
    args = common_args(out, lora, **extra)
    if ort:
        config = ORTSFTConfig(ort_fallback="disable", ort_log_level="ERROR", **args)
        trainer = ORTSFTTrainer(
            model=model,
            args=config,
            train_dataset=_data(kind),
            processing_class=tokenizer,
            peft_config=lora_config(family) if lora else None,
        )
    else:
        trainer = trl.SFTTrainer(
            model=model,
            args=trl.SFTConfig(**args),
            train_dataset=_data(kind),
            processing_class=tokenizer,
            peft_config=lora_config(family) if lora else None,
        )
    trainer.train()
    return trainer


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sft_through_ort_equals_sft_trainer(name, tmp_path):
    reference = _train(name, tmp_path / "pt", ort=False)
    trainer = _train(name, tmp_path / "ort", ort=True)
    assert_same_run(reference, trainer, KEYS)
    ours = weights(trainer.model)
    initial = build_model(build_tokenizer(), family=CONFIGS[name][3]).state_dict()
    assert (
        any(
            not torch.equal(v, initial[k.replace("base_model.model.", "").replace(".base_layer", "")])
            for k, v in ours.items()
            if "lora_" not in k
        )
        or CONFIGS[name][1]
    )
    if CONFIGS[name][1]:
        assert all(not torch.equal(v, torch.zeros_like(v)) for k, v in ours.items() if "lora_B" in k)


def test_the_mixin_on_sft_trainer_gets_ort_sft_config(tmp_path):
    """class X(ORTTrainerMixin, SFTTrainer) with a plain SFTConfig: the parent gets ORTSFTConfig."""
    from ort_hf.trainer import ORTTrainerMixin

    class MySFTTrainer(ORTTrainerMixin, trl.SFTTrainer):
        pass

    tokenizer = build_tokenizer()
    config = trl.SFTConfig(**common_args(tmp_path, False, max_length=32))
    trainer = MySFTTrainer(
        build_model(tokenizer), config, train_dataset=_data("prompt-completion"), processing_class=tokenizer
    )
    assert type(trainer.args) is ORTSFTConfig and trainer.args.max_length == 32
    import ort_hf

    assert ort_hf.ORTSFTConfig is ORTSFTConfig  # exported lazily from the package too
    assert trainer._fused_head is not None and trainer._fused_head.outputs == ("log_probs", "entropy", "is_top1")


@pytest.mark.parametrize(
    "option, value", [("label_smoothing_factor", 0.1), ("bf16", True), ("use_module_with_loss", False)]
)
def test_what_ort_cannot_run_is_refused_before_training(option, value, tmp_path):
    tokenizer = build_tokenizer()
    with pytest.raises(ValueError, match=option):
        args = ORTSFTConfig(**{**common_args(tmp_path, False), option: value})
        ORTSFTTrainer(
            model=build_model(tokenizer),
            args=args,
            train_dataset=_data("prompt-completion"),
            processing_class=tokenizer,
        )


def test_unset_bf16_means_fp32_on_cpu(tmp_path):
    assert trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True).bf16 is True  # TRL's default
    assert ORTSFTConfig(output_dir=str(tmp_path), use_cpu=True).bf16 is False
    assert ORTSFTConfig(output_dir=str(tmp_path), use_cpu=True, use_ort=False).bf16 is False  # A/B alike
