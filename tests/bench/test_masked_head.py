"""The bench's hand-written masked-only head (``masked-head`` variant) computes the model's own
MLM loss and gradients, for every masked-LM family it may meet (not only BERT's ``.cls``)."""

import pytest
import torch
import transformers as tf

from ort_hf.bench.models import MaskedHeadMLM

VOCAB, SEQ, BATCH = 100, 16, 4
SMALL = dict(vocab_size=VOCAB, pad_token_id=0)
BERT_LIKE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    **SMALL,
)
CONFIGS = {
    "bert": (tf.BertForMaskedLM, lambda: tf.BertConfig(**BERT_LIKE)),
    "roberta": (tf.RobertaForMaskedLM, lambda: tf.RobertaConfig(**BERT_LIKE)),
    "distilbert": (
        tf.DistilBertForMaskedLM,
        lambda: tf.DistilBertConfig(
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            **SMALL,
        ),
    ),
    "albert": (tf.AlbertForMaskedLM, lambda: tf.AlbertConfig(embedding_size=16, **BERT_LIKE)),
    "electra": (tf.ElectraForMaskedLM, lambda: tf.ElectraConfig(embedding_size=16, **BERT_LIKE)),
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_masked_head_equals_the_models_own_loss_and_gradients(family):
    model_cls, make_config = CONFIGS[family]
    torch.manual_seed(0)
    reference = model_cls(make_config())
    masked = MaskedHeadMLM(model_cls(make_config()))
    masked.mlm.load_state_dict(reference.state_dict())

    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, -5:] = 0
    labels = torch.full_like(input_ids, -100)
    chosen = torch.rand(BATCH, SEQ, generator=g) < 0.2
    chosen[1, 3] = True
    labels[chosen] = input_ids[chosen]

    expected = reference(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    got = masked(input_ids=input_ids, attention_mask=attention_mask, labels=labels)["loss"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    expected.backward()
    got.backward()
    for (name, p_ref), p_got in zip(reference.named_parameters(), masked.mlm.parameters()):
        if p_ref.grad is None:
            assert p_got.grad is None or not p_got.grad.any(), name
            continue
        torch.testing.assert_close(p_got.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)

    # Outside its own forward the hook leaves the base model alone: full-length hidden states.
    full = masked.mlm(input_ids=input_ids, attention_mask=attention_mask).logits
    assert full.shape == (BATCH, SEQ, VOCAB)


def test_masked_head_refuses_a_model_without_a_separate_head():
    with pytest.raises(ValueError, match="base model and a head"):
        MaskedHeadMLM(tf.BertModel(tf.BertConfig(**BERT_LIKE)))
