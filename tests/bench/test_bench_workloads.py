"""The workloads built in code: LoRA on a Qwen2-shaped causal LM (a prompt's labels masked) and the
BERT-base-sized classifier; the model's dropout is what the bench trains unless --dropout."""

import pytest
import torch
from transformers import AutoTokenizer

from ort_hf.bench.data import build_dataset
from ort_hf.bench.models import build_model
from ort_hf.bench.sources import DataMissing, data_file, length_problem, model_config, model_problem
from ort_hf.bench.spec import LORA_DROPOUT, WORKLOADS, BenchSettings


def test_lora_rows_mask_the_first_half_of_their_labels(tmp_path, minilm_dir):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"line {i} of a text that is long enough to fill a few chunks ." for i in range(40)))
    settings = BenchSettings(steps=2, warmup_steps=1, seq_len=16, train_file=str(text))
    dataset = build_dataset(WORKLOADS["lora-55m"], settings, AutoTokenizer.from_pretrained(minilm_dir))
    assert len(dataset) == 3 * WORKLOADS["lora-55m"].batch_size
    labels, ids = torch.tensor(dataset["labels"]), torch.tensor(dataset["input_ids"])
    assert (labels[:, :8] == -100).all()
    assert torch.equal(labels[:, 8:], ids[:, 8:])


def test_lora_55m_is_a_peft_lora_qwen2_of_that_size_with_the_model_dropout(minilm_dir):
    settings = BenchSettings()
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    model = build_model(WORKLOADS["lora-55m"], settings, tokenizer)
    total = sum(p.numel() for p in model.parameters())
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert 50e6 < total < 60e6
    assert trained and all("lora_" in n and ("q_proj" in n or "v_proj" in n) for n in trained)
    assert model.base_model.model.config.model_type == "qwen2"
    assert model.peft_config["default"].lora_dropout == LORA_DROPOUT
    no_dropout = build_model(WORKLOADS["lora-55m"], BenchSettings(dropout=0.0), tokenizer)
    assert no_dropout.peft_config["default"].lora_dropout == 0.0


def test_bert_base_keeps_its_dropout_unless_told(minilm_dir):
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    workload = WORKLOADS["bert-base"]
    model = build_model(workload, BenchSettings(), tokenizer, num_labels=2)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (768, 12)
    assert model.config.hidden_dropout_prob == 0.1
    assert build_model(workload, BenchSettings(dropout=0.0), tokenizer).config.hidden_dropout_prob == 0.0


def test_built_in_workloads_take_only_the_tokenizer_of_a_model_folder(tiny_model_dir):
    settings = BenchSettings(model_dir=str(tiny_model_dir))  # a 64-position BERT classifier
    config = model_config(settings)
    for name in ("bert-base", "lora-485m"):
        assert model_problem(WORKLOADS[name], settings, config) is None
        assert length_problem(WORKLOADS[name], settings, config) is None


def test_without_data_dir_or_train_file_a_workload_says_what_to_pass():
    with pytest.raises(DataMissing, match="--data_dir"):
        data_file(WORKLOADS["lora-55m"], BenchSettings())
