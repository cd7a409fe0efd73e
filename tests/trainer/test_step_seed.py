"""Dropout masks in the ORT graph are a function of the optimizer step on every training path: a run
resumed from a checkpoint ends with the weights of the uninterrupted run, with ModuleWithLoss off and
with a subclass whose compute_loss never calls the parent's."""

import pytest
import torch
from tiny_models import FAMILIES, build, rule_dataset, tiny_args

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


class OwnLossTrainer(ORTTrainer):
    """The common user override: the loss from the model's outputs, no call to the parent's compute_loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        logits = model(**inputs).logits
        return torch.nn.functional.cross_entropy(logits, labels)


def _train(trainer_cls, out, resume=None):
    model = build(FAMILIES["bert-cls"], dropout=0.2)
    args = tiny_args(ORTTrainingArguments, out, max_steps=4, save_steps=2, save_strategy="steps",
                     per_device_train_batch_size=8, learning_rate=1e-3, use_module_with_loss=False)
    trainer = trainer_cls(model=model, args=args, train_dataset=rule_dataset(32))
    trainer.train(resume_from_checkpoint=resume)
    assert trainer.ort_engine_status().backend == "ort"
    nodes = trainer.ort_engine.training_graph().graph.node
    assert any(a.s == b"ort_hf::cpu_dropout" for n in nodes if n.op_type == "ATen" for a in n.attribute)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("trainer_cls", [ORTTrainer, OwnLossTrainer])
def test_resumed_run_draws_the_uninterrupted_masks(trainer_cls, tmp_path):
    full = _train(trainer_cls, tmp_path / "full")
    resumed = _train(trainer_cls, tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    worst = max(float((full[n] - resumed[n]).abs().max()) for n in full)
    assert worst <= 1e-6, f"resumed weights differ by {worst:.1e}: other dropout masks"
