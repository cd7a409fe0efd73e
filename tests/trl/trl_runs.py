"""Plain TRL trainer vs its ORT counterpart from the same seed, on a tiny chat model built in code:
ort_hf/trl/tiny_chat.py's byte-level tokenizer with a ChatML template and its small Qwen2 (or
another of its families)."""

from __future__ import annotations

import torch
import transformers

from ort_hf.trl import tiny_chat

STEPS = 8


def common_args(out, lora: bool, **extra) -> dict:
    return tiny_chat.comparison_args(out, lora, STEPS, **extra)


def build_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Byte-level (every byte a token, plus ChatML's three specials: 259), with tiny_chat's template."""
    return tiny_chat.build_tokenizer()


def build_model(
    tokenizer, seed: int = 0, family: str = "qwen2", initializer_range: float = 0.02
) -> transformers.PreTrainedModel:
    """A two-layer causal LM (hidden size 32) of ``family`` (tiny_chat.families) for ``tokenizer``,
    from ``seed``, without dropout. At the default ``initializer_range`` every next-token
    distribution is close to uniform (entropy near log 259); at 1.0 the entropies spread from about
    0.1 to 2.5."""
    return tiny_chat.build_model(tokenizer, seed=seed, family=family, initializer_range=initializer_range)


def lora_config(family: str = "qwen2", **options):
    import peft

    return peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=tiny_chat.lora_targets(family),
        task_type="CAUSAL_LM",
        fan_in_fan_out=family == "gpt2",  # GPT-2's Conv1D stores its weight transposed
        **options,
    )


def logged(trainer, keys) -> list[dict]:
    rows = [h for h in trainer.state.log_history if "loss" in h]
    assert len(rows) == STEPS, f"{len(rows)} logged steps"
    return [{k: h[k] for k in keys} for h in rows]


def assert_same_logs(reference: list[dict], ours: list[dict], atol: float = 1e-4) -> None:
    for step, (a, b) in enumerate(zip(reference, ours), 1):
        for key, value in a.items():
            assert abs(value - b[key]) <= atol, f"step {step} {key}: {value} vs {b[key]}"


def assert_ort_trained_on_used_rows(trainer) -> dict:
    """ORT ran (fallback disabled) and its graph runs the vocabulary projection on the gathered rows."""
    status = trainer.ort_engine_status()
    assert status.backend == "ort" and trainer.args.ort_fallback == "disable", status
    facts = next(h for h in trainer.state.log_history if "ort/export_s" in h)
    assert facts["ort/head_on_used_rows"] == 1.0, facts
    assert 0 < facts["ort/head_label_density"] < 1, facts
    return facts


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_run(reference, trainer, keys) -> None:
    """ORT trained (on the used rows), and its logs and final weights are the plain trainer's."""
    assert_ort_trained_on_used_rows(trainer)
    assert_same_logs(logged(reference, keys), logged(trainer, keys))
    ours, theirs = weights(trainer.model), weights(reference.model)
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
