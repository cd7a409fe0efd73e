"""LoRA (peft) through ORTTrainer: adapters train as with Trainer, the base stays frozen, and the
saved adapter is plain PEFT's."""

import pytest
import torch
from parity import graph_gradients
from parity import trainable as trainable_names
from tiny_models import FAMILIES, build, id_dataset, tiny_args
from transformers import Trainer, TrainingArguments

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

peft = pytest.importorskip("peft", reason="peft is not installed (pip install 'ort_hf[peft]')")


def _lora(model, task_type="CAUSAL_LM", target=("q_proj", "v_proj"), **kw):
    torch.manual_seed(1)
    return peft.get_peft_model(
        model,
        peft.LoraConfig(task_type=task_type, r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(target), **kw),
    )


def _clm_data(rows=16, seq=12):
    return id_dataset(rows, seq, lambda ids, g: ids.masked_fill(torch.arange(seq) < seq // 2, -100))  # prompt masked


def _train(out, ort: bool, model=None, data=None, resume=None, **kw):
    model = model if model is not None else _lora(build(FAMILIES["llama-clm"]))
    args = tiny_args(
        ORTTrainingArguments if ort else TrainingArguments,
        out,
        **{"max_steps": 4, "per_device_train_batch_size": 4, "learning_rate": 1e-2, "optim": "sgd", **kw},
    )
    trainer = (ORTTrainer if ort else Trainer)(model=model, args=args, train_dataset=data or _clm_data())
    trainer.train(resume_from_checkpoint=resume)
    return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_lora_on_tiny_llama_trains_adapters_only_as_trainer_does(tmp_path):
    ref_model, model = _lora(build(FAMILIES["llama-clm"])), _lora(build(FAMILIES["llama-clm"]))
    before = _weights(model)
    _, ref_losses = _train(tmp_path / "pt", False, ref_model)
    trainer, losses = _train(tmp_path / "ort", True, model)
    assert trainer.ort_engine_status().backend == "ort"
    assert trainer._ort_run.loss_module.loss_kind == "cross_entropy"  # PEFT passes labels to the model's own loss
    assert trainer.ort_engine.label_sparsity_fired() is True  # prompt-masked labels
    # ORT's graph computes the adapters' gradients only, none for the frozen base model
    graph_grads = graph_gradients(trainer.ort_engine)
    assert graph_grads == trainable_names(trainer.ort_engine.module)
    assert len(graph_grads) == 8  # lora_A and lora_B, on q and v, in 2 layers
    assert max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-4
    after, ref_after = _weights(model), _weights(ref_model)
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable and all("lora_" in n for n in trainable)
    assert {n for n in trainable if "lora_B" in n} <= changed  # B starts at zero: every one must move
    for name in after:
        torch.testing.assert_close(after[name], ref_after[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")

    trainer.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()  # the adapter, not the whole model
    loaded = peft.PeftModel.from_pretrained(build(FAMILIES["llama-clm"]), str(tmp_path / "adapter"))
    for name, value in loaded.named_parameters():
        if "lora_" in name:
            torch.testing.assert_close(value, after[name])


def test_lora_resume_continues_the_run(tmp_path):
    full, full_losses = _train(tmp_path / "full", True, save_strategy="steps", save_steps=2)
    full_weights = _weights(full.model)
    import shutil

    shutil.copytree(tmp_path / "full" / "checkpoint-2", tmp_path / "part" / "checkpoint-2")
    part, part_losses = _train(
        tmp_path / "part", True, resume=str(tmp_path / "part" / "checkpoint-2"), save_strategy="steps", save_steps=2
    )
    assert part.ort_engine_status().backend == "ort"
    assert part_losses == pytest.approx(full_losses, abs=1e-5)
    for name, value in _weights(part.model).items():
        torch.testing.assert_close(value, full_weights[name], rtol=1e-4, atol=1e-6)


def test_lora_on_packaged_minilm_classifier(minilm_dir, tmp_path):
    from transformers import BertForSequenceClassification

    data = id_dataset(16, 12, lambda ids, g: (ids[:, 0] > 10000).long(), low=1000, high=20000)
    runs = {}
    for ort in (False, True):
        torch.manual_seed(0)
        base = BertForSequenceClassification.from_pretrained(  # no dropout: ORT draws other masks than torch
            minilm_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
        model = _lora(base, task_type="SEQ_CLS", target=("query", "value"))
        trainer, losses = _train(tmp_path / str(ort), ort, model, data)
        runs[ort] = (losses, _weights(model))
    assert trainer.ort_engine_status().backend == "ort"
    assert max(abs(a - b) for a, b in zip(runs[False][0], runs[True][0])) <= 1e-4
    for name, value in runs[True][1].items():
        torch.testing.assert_close(value, runs[False][1][name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
