"""The packaged real checkpoint (MiniLM-L6-H384) trains through wrap_model with parity."""

import torch
from parity import assert_parity, run_parity
from transformers import AutoTokenizer, BertForSequenceClassification

SENTENCES = [
    ("a warm , funny and deeply moving film", 1),
    ("the plot is thin and the jokes fall flat", 0),
    ("one of the best performances of the year", 1),
    ("tedious , overlong and badly acted", 0),
    ("an unexpected delight from start to finish", 1),
    ("i wanted my two hours back", 0),
    ("sharp writing and a terrific cast", 1),
    ("a mess of a movie with nothing to say", 0),
]


def test_minilm_sequence_classification_parity(minilm_dir):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    assert model.config.vocab_size == 30522 and model.config.num_hidden_layers == 6
    model.train()
    batches = []
    for start in range(0, len(SENTENCES), 4):
        chunk = SENTENCES[start : start + 4]
        enc = tok([s for s, _ in chunk], padding="max_length", max_length=16, truncation=True, return_tensors="pt")
        batches.append({**enc, "labels": torch.tensor([y for _, y in chunk])})
    batches = batches * 3  # 6 steps over real sentences
    assert_parity(*run_parity(model, batches, lr=5e-5))
