"""Encoder-decoders that build their decoder inputs from ``labels`` inside ``forward`` and have no
``prepare_decoder_input_ids_from_labels`` (Blenderbot, M2M100, NLLB-MoE, SeamlessM4T's text-to-text):
DataCollatorForSeq2Seq gives them labels only, and ModuleWithLoss's cross-entropy, which calls the
model without its labels, used to leave them with no decoder inputs at all ("You cannot specify
both decoder_input_ids and decoder_inputs_embeds")."""

import copy

import pytest
import torch
import transformers as tf

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.module_with_loss.module_with_loss import CROSS_ENTROPY, ModuleWithLoss

OPTIONS = ORTOptions(fallback="disable", log_level="ERROR", intra_op_threads=1, preflight="never")


def _tiny(name):
    torch.manual_seed(0)
    size = {
        "vocab_size": 64,
        "d_model": 16,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32,
        "max_position_embeddings": 64,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "decoder_start_token_id": 2,
        # no random draws (dropout, LayerDrop): the two runs are compared step by step
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
    }
    if name == "blenderbot-small":
        return tf.BlenderbotSmallForConditionalGeneration(tf.BlenderbotSmallConfig(**size))
    return tf.M2M100ForConditionalGeneration(tf.M2M100Config(**size))


def _batches(n=3, batch=4):
    # DataCollatorForSeq2Seq's batch for these models: labels -100 on padding, no decoder_input_ids
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids, labels = torch.randint(3, 64, (batch, 9), generator=g), torch.randint(3, 64, (batch, 7), generator=g)
        mask = torch.ones_like(ids)
        mask[0, 6:], labels[1, 4:] = 0, -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


@pytest.mark.parametrize("name", ["blenderbot-small", "m2m_100"])
def test_cross_entropy_trains_as_the_models_own_loss_through_ort(name):
    model = _tiny(name)
    assert not hasattr(model, "prepare_decoder_input_ids_from_labels")
    reference = copy.deepcopy(model)
    module = ModuleWithLoss(model)
    assert module.loss_kind == CROSS_ENTROPY
    wrapped = wrap_model(module, OPTIONS)
    wrapped.train(), reference.train()
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(reference.parameters(), lr=0.5)
    for batch in _batches():
        got, want = wrapped(**batch)["loss"], reference(**batch).loss  # Trainer's loss: the model's own
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        got.backward(), want.backward()
        for (n, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    assert wrapped.engine_status().backend == "ort"
    # The model's own loss from the labels it was given is dropped from the graph: one cross-entropy.
    ops = [node.op_type for node in wrapped.training_graph().graph.node]
    losses = [
        op
        for op in ops
        if op in ("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossInternal", "NegativeLogLikelihoodLoss")
    ]
    assert len(losses) == 1, losses
