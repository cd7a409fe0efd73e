"""A mixture-of-experts model trains through ORTTrainer as through Trainer: tiny Mixtral (transformers'
default grouped_mm experts, whose token counts are ``aten::histc`` and whose projections are
``aten::_grouped_mm``: neither exported before ``engine/symbolics``), ragged right-padded batches,
fallback disabled, ORT proven to have run."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from datasets import Dataset
from tiny_models import VOCAB, pad_right, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

STEPS, BATCH = 4, 4
LENGTHS = [16, 11, 7, 14, 9, 16, 5, 12, 13, 6, 16, 10, 8, 15, 4, 11]  # one row each; no batch of one length


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _mixtral():
    torch.manual_seed(0)
    config = tf.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_jitter_noise=0.0,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        pad_token_id=0,
        use_cache=False,
    )
    model = tf.MixtralForCausalLM(config)
    assert model.config._experts_implementation == "grouped_mm"  # the path that calls histc and _grouped_mm
    return model


def _data() -> Dataset:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]
    return Dataset.from_dict({"input_ids": rows})


def _train(tmp_path, ort: bool):
    model = _mixtral()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    common = dict(
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-2,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        use_cpu=True,
        dataloader_num_workers=0,
        train_sampling_strategy="sequential",
    )
    if ort:
        args = tiny_args(ORTTrainingArguments, tmp_path / "ort", ort_intra_op_threads=1, **common)
        trainer = ORTTrainer(model=model, args=args, train_dataset=_data(), data_collator=pad_right)
    else:
        args = tiny_args(TrainingArguments, tmp_path / "pt", **common)
        trainer = Trainer(model=model, args=args, train_dataset=_data(), data_collator=pad_right)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS
    return trainer, losses, initial, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_tiny_mixtral_trains_as_with_trainer(tmp_path):
    _, ref_losses, initial, ref_params = _train(tmp_path, ort=False)
    trainer, losses, _, params = _train(tmp_path, ort=True)
    assert trainer.ort_engine_status().backend == "ort"
    ops = [
        next((a.s.decode() for a in n.attribute if a.name == "operator"), n.op_type)
        for n in trainer.ort_engine.training_graph().graph.node
    ]
    assert "_grouped_mm" in ops, "the experts did not run as grouped_mm"
    diffs = [abs(a - b) for a, b in zip(ref_losses, losses)]
    assert max(diffs) <= 1e-4, f"per-step losses differ by up to {max(diffs):.2e}: {ref_losses} vs {losses}"
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    unchanged = [n for n in params if torch.equal(params[n], initial[n])]
    assert not unchanged, f"not trained: {unchanged}"  # experts and routers included
