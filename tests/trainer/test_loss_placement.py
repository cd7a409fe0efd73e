"""Where ModuleWithLoss's cross-entropy runs: inside the ORT graph when label sparsity can fire,
in PyTorch from ORT's logits when labels are dense and the fused LM-head loss is off
(--ort_chunked_lm_loss false here; that loss: test_chunked_lm_loss.py). Same losses either way."""

import pytest
import torch
from tiny_models import FAMILIES, build, id_dataset, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

SEQ, ROWS = 32, 32


def _clm_dataset(prompt_len: int):
    """Causal-LM rows; the first ``prompt_len`` labels of each row are ignored (SFT-style prompt masking)."""
    return id_dataset(ROWS, SEQ, lambda ids, g: ids.masked_fill(torch.arange(SEQ) < prompt_len, -100))


def _train(cls_trainer, cls_args, out, dataset, family="llama-clm", **kw):
    args = dict(max_steps=6, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-3)
    args.update(kw)
    model = build(FAMILIES[family])
    trainer = cls_trainer(model=model, args=tiny_args(cls_args, out, **args), train_dataset=dataset)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _logged(trainer, key):
    return next(h[key] for h in trainer.state.log_history if key in h)


@pytest.fixture(scope="module")
def pytorch_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("pt")
    return {
        prompt: _train(Trainer, TrainingArguments, out / str(prompt), _clm_dataset(prompt)) for prompt in (0, SEQ // 2)
    }


@pytest.mark.parametrize("placement", ["auto", "always"])
def test_dense_causal_lm_labels_keep_the_loss_in_pytorch_unless_fused(pytorch_runs, tmp_path, placement):
    _, ref_losses, ref_params = pytorch_runs[0]
    trainer, losses, params = _train(
        ORTTrainer,
        ORTTrainingArguments,
        tmp_path,
        _clm_dataset(0),
        ort_loss_in_graph=placement,
        ort_chunked_lm_loss=False,
    )
    assert trainer.ort_engine_status().backend == "ort"
    assert _logged(trainer, "ort/loss_in_graph") == (placement == "always")
    assert trainer.ort_engine.label_sparsity_fired() is False  # nothing to drop at ~97% density
    assert len(losses) == 6 and max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-4
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("placement", ["auto", "always"])
def test_gpt2_labels_are_shifted_like_its_own_loss(tmp_path, placement):
    """GPT2LMHeadModel has no loss_type, so transformers' Trainer does not flag it as shifting
    its labels; ModuleWithLoss must shift them anyway, in PyTorch and in the ORT graph."""
    data = _clm_dataset(0)
    _, ref_losses, ref_params = _train(Trainer, TrainingArguments, tmp_path / "pt", data, family="gpt2-clm")
    trainer, losses, params = _train(
        ORTTrainer,
        ORTTrainingArguments,
        tmp_path / "ort",
        data,
        family="gpt2-clm",
        ort_loss_in_graph=placement,
        ort_chunked_lm_loss=False,
    )
    assert trainer.ort_engine_status().backend == "ort"
    assert trainer._ort_run.loss_module.shift_labels is True
    assert max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-4
    # Adam turns float rounding in near-zero gradients into steps of up to lr (1e-3): a few
    # weights of GPT-2 land ~1e-4 apart after 6 steps. Unshifted labels move them far more.
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-4, atol=3e-4, msg=lambda m: f"{name}: {m}")


def test_prompt_masked_labels_keep_the_loss_in_the_graph(pytorch_runs, tmp_path):
    _, ref_losses, _ = pytorch_runs[SEQ // 2]
    trainer, losses, _ = _train(ORTTrainer, ORTTrainingArguments, tmp_path, _clm_dataset(SEQ // 2))
    assert _logged(trainer, "ort/loss_in_graph") == 1.0
    assert trainer.ort_engine.label_sparsity_fired() is True
    assert 0.4 < _logged(trainer, "ort/label_density") < 0.6
    assert max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-4


def test_never_computes_a_sequence_classification_loss_in_pytorch(tmp_path):
    data = id_dataset(16, 12, lambda ids, g: torch.randint(0, 2, (16,), generator=g), seed=1, attention_mask=False)
    runs = {}
    for placement in ("auto", "never"):
        args = tiny_args(
            ORTTrainingArguments,
            tmp_path / placement,
            max_steps=3,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            label_smoothing_factor=0.1,
            ort_loss_in_graph=placement,
        )
        trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=data)
        trainer.train()
        runs[placement] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert _logged(trainer, "ort/loss_in_graph") == (placement == "auto")
        assert trainer.ort_engine_status().backend == "ort"
    assert max(abs(a - b) for a, b in zip(runs["auto"], runs["never"])) <= 1e-5
