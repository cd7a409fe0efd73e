"""Memory-efficient gradient management (gradients handed to PyTorch as ORT computes them)."""

import torch
from sst2 import sst2_dataset
from transformers import AutoTokenizer, BertForSequenceClassification, TrainerCallback

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


class CountGradHooks(TrainerCallback):
    """Counts gradient hook calls per parameter per backward."""

    def __init__(self):
        self.calls: dict[str, int] = {}

    def attach(self, model):
        for name, p in model.named_parameters():
            p.register_hook(lambda g, name=name: self.calls.__setitem__(name, self.calls.get(name, 0) + 1))


def _run(minilm_dir, data, out, on: bool):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    hooks = CountGradHooks()
    hooks.attach(model)
    args = ORTTrainingArguments(
        output_dir=str(out),
        max_steps=20,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=5e-5,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        ort_fallback="disable",
        ort_log_level="ERROR",
        ort_mem_efficient_grad_mgmt=on,
    )
    trainer = ORTTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert trainer.ort_engine_status().backend == "ort"
    assert trainer.ort_engine.mem_efficient_grad_active() is on  # read from ORT's graph
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, hooks.calls


def test_mem_efficient_grad_mgmt_changes_nothing(tmp_path, minilm_dir, shared_data):
    data = sst2_dataset(shared_data, AutoTokenizer.from_pretrained(minilm_dir), limit=160, max_length=24)
    off_losses, off_params, off_calls = _run(minilm_dir, data, tmp_path / "off", False)
    on_losses, on_params, on_calls = _run(minilm_dir, data, tmp_path / "on", True)
    assert max(abs(a - b) for a, b in zip(off_losses, on_losses)) <= 1e-5
    for name, ref in off_params.items():
        torch.testing.assert_close(on_params[name], ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    # 20 optimizer steps x 2 micro-batches: each parameter's hook fires once per backward
    assert set(on_calls.values()) == {40} and on_calls == off_calls
