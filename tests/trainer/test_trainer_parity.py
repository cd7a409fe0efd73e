"""ORTTrainer vs transformers.Trainer on the packaged MiniLM and real SST-2 sentences."""

import pytest
import torch
from sst2 import sst2_dataset
from transformers import AutoTokenizer, BertForSequenceClassification, Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

STEPS = 30


def _train(minilm_dir, dataset, out, ort: bool, **extra):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    common = dict(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=5e-5,
        logging_steps=1,
        seed=0,
        report_to=[],
        save_strategy="no",
        optim="adamw_torch",
        disable_tqdm=True,
        **extra,
    )
    if ort:
        args = ORTTrainingArguments(ort_fallback="disable", ort_log_level="ERROR", **common)
        trainer = ORTTrainer(model=model, args=args, train_dataset=dataset)
    else:
        trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=dataset)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS
    return trainer, losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def dataset(minilm_dir, shared_data):
    return sst2_dataset(shared_data, AutoTokenizer.from_pretrained(minilm_dir))


@pytest.mark.parametrize(
    "mwl,smoothing", [(True, 0.0), (False, 0.0), (True, 0.1)], ids=["module_with_loss", "model_loss", "smoothing"]
)
def test_ort_trainer_matches_trainer(minilm_dir, dataset, tmp_path, mwl, smoothing):
    _, ref_losses, ref_params = _train(
        minilm_dir, dataset, tmp_path / "pt", ort=False, label_smoothing_factor=smoothing
    )
    trainer, losses, params = _train(
        minilm_dir, dataset, tmp_path / "ort", ort=True, use_module_with_loss=mwl, label_smoothing_factor=smoothing
    )
    assert trainer.ort_engine.engine_status().backend == "ort"
    aten = [
        a.s.decode()
        for n in trainer.ort_engine.training_graph().graph.node
        if n.op_type == "ATen"
        for a in n.attribute
        if a.name == "operator"
    ]
    assert "ort_hf::embedding_dense_grad" in aten, aten  # ort_hf's kernel for the embedding tables
    # aten's is left only to padding elimination's row gathers (lookups into activations).
    assert trainer.ort_engine.padding_rewrite is not None or "embedding_backward" not in aten, aten
    assert trainer.model is not trainer.ort_engine  # self.model stays the plain HF model
    diffs = [abs(a - b) for a, b in zip(ref_losses, losses)]
    assert max(diffs) <= 1e-4 + 1e-9, f"max loss diff {max(diffs):.2e}"
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    changed = [n for n in ref_params if not torch.equal(ref_params[n], params[n])]
    assert changed, "comparison saw identical tensors only"
