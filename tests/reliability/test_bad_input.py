"""Bad input ends in a clear message before ORT runs."""

import logging
import os

import pytest
import torch
from tiny_models import FAMILIES, VOCAB, build, id_dataset

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def _data(n=16, high=VOCAB):
    return id_dataset(n, 8, lambda ids, g: ids[:, 0] % 2, high=high)


def _trainer(tmp_path, data, model=None, **kw):
    args = ORTTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
        **kw,
    )
    return ORTTrainer(model=model or build(FAMILIES["bert-cls"]), args=args, train_dataset=data)


def test_token_ids_beyond_the_vocabulary_are_caught_before_ort(tmp_path):
    trainer = _trainer(tmp_path, _data(high=VOCAB + 50))  # a tokenizer bigger than the model
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \(vocab_size=100\).*resize_token_embeddings"):
        trainer.train()
    assert trainer.ort_engine_status().backend == "not_run"  # no ORT session ever saw the batch


def test_empty_dataset(tmp_path):
    with pytest.raises(ValueError, match="train dataset is empty"):
        _trainer(tmp_path, _data().select([])).train()


def test_missing_labels_for_module_with_loss(tmp_path):
    with pytest.raises(ValueError, match="did not return a loss"):
        _trainer(tmp_path, _data().remove_columns("labels")).train()


def _non_finite_warnings(trainer, caplog) -> list[str]:
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        trainer.train()
    assert trainer.ort_engine_status().backend == "ort"
    return [r.getMessage() for r in caplog.records if "non-finite loss" in r.getMessage()]


def test_nan_loss_is_reported_with_the_step(tmp_path, caplog):
    trainer = _trainer(
        tmp_path,
        _data(),
        learning_rate=1e9,
        max_grad_norm=0.0,
        logging_steps=1,
        ort_density_callback=False,
        ort_memory_callback=False,
    )
    said = _non_finite_warnings(trainer, caplog)
    assert said and "at step" in said[0]
    # As the Trainer does for PyTorch: the logged loss filters non-finite values.
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


def test_failed_run_leaves_environment_unchanged(tmp_path):
    class WithEigh(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 4)

        def forward(self, input_ids, attention_mask=None, labels=None):
            h = self.embed(input_ids).mean(1)
            logits = h * torch.linalg.eigh(h.T @ h)[0].sum()
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    before = dict(os.environ)
    with pytest.raises(Exception, match="aten::linalg_eigh"):
        _trainer(tmp_path, _data(), model=WithEigh()).train()
    assert dict(os.environ) == before


def test_a_batch_without_labelled_tokens_says_why_its_loss_is_nan(tmp_path, caplog):
    data = id_dataset(16, 8, lambda ids, g: torch.full_like(ids, -100))  # every token ignored
    trainer = _trainer(
        tmp_path, data, model=build(FAMILIES["bert-mlm"]), ort_density_callback=False, ort_memory_callback=False
    )
    said = _non_finite_warnings(trainer, caplog)
    assert said and "Every label of this batch is -100" in said[0]


@pytest.mark.parametrize(
    "device, step, logging_steps, due",
    [
        ("cpu", 7, 5, True),  # nothing runs ahead of the host: every step
        ("cuda", 0, 5, True),
        ("cuda", 4, 5, True),
        ("cuda", 7, 5, False),
        ("cuda", 3, 0, False),
    ],
)
def test_host_reading_checks_run_on_an_accelerator_only_where_the_trainer_syncs(device, step, logging_steps, due):
    from ort_hf.trainer.checks import host_check_due

    assert host_check_due(device, step, logging_steps) is due
