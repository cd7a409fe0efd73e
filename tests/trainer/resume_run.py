"""Run by test_resume in fresh processes: 20 ORTTrainer steps of a tiny BERT on SST-2 sentences,
checkpointing every 10, optionally resuming; writes the logged losses as JSON."""

import json
import sys
from pathlib import Path

import torch
from sst2 import sst2_dataset
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def main(shared_data: str, minilm_dir: str, out: str, resume: str, losses_path: str) -> None:
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    dataset = sst2_dataset(Path(shared_data), tok, limit=160, max_length=24)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        num_labels=2,  # dropout on: ORT RNG must resume too
    )
    args = ORTTrainingArguments(
        output_dir=out,
        max_steps=20,
        save_steps=10,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        report_to=[],
        optim="adamw_torch",
        disable_tqdm=True,
        save_only_model=False,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    trainer = ORTTrainer(model=BertForSequenceClassification(config), args=args, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=resume or None)
    assert trainer.ort_engine.engine_status().backend == "ort"
    # The masks resumed are those of ort_hf's CPU dropout kernels (engine/cpu_kernel_swaps.py).
    nodes = trainer.ort_engine.training_graph().graph.node
    aten = {a.s.decode() for n in nodes if n.op_type == "ATen" for a in n.attribute if a.name == "operator"}
    assert "ort_hf::cpu_dropout" in aten and not any(n.op_type == "Dropout" for n in nodes), aten
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    Path(losses_path).write_text(json.dumps(losses))


if __name__ == "__main__":
    main(*sys.argv[1:])
