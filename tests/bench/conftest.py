import pytest
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification


@pytest.fixture(scope="session")
def tiny_model_dir(minilm_dir, tmp_path_factory):
    """A 2-layer BERT classifier (2 labels) with the MiniLM tokenizer: a --model_dir for short runs."""
    path = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
