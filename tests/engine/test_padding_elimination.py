"""Padding elimination on CPU: the token-wise nodes of ORT's training graph run on the real tokens
only, and training matches PyTorch's exactly as without it."""

import pytest
import torch
from parity import STRICT, assert_parity, run_parity
from tiny_models import BATCH, EXTRA_FAMILIES, FAMILIES, SEQ, build, ragged_batch

from ort_hf.engine import ORTOptions, wrap_model


def _ragged(task, gen, steps=3, pad_left=False):
    return [
        ragged_batch([SEQ, *torch.randint(2, SEQ - 4, (BATCH - 1,), generator=gen).tolist()], task, gen, pad_left)
        for _ in range(steps)
    ]


def _unpadded_matmuls(wrapped) -> int:
    """MatMul-like nodes of ORT's training graph whose activation input is the real tokens' rows."""
    nodes = wrapped.training_graph().graph.node
    return sum(1 for n in nodes if n.op_type in ("MatMul", "FusedMatMul", "Gemm") and "/unpadded" in n.input[0])


@pytest.mark.parametrize("family", ["bert-cls", "qwen2-clm"])
def test_training_with_padding_eliminated_matches_pytorch(family):
    fam = {**FAMILIES, **EXTRA_FAMILIES}[family]
    batches = _ragged(fam.task, torch.Generator().manual_seed(3))
    result = run_parity(build(fam, attn="sdpa"), batches)
    wrapped = result[-1]
    assert_parity(*result)
    assert wrapped.padding_rewrite is not None and wrapped.padding_rewrite.unpadded_nodes > 0
    assert _unpadded_matmuls(wrapped) > 0, "ORT's graph runs no projection on the unpadded rows"


def test_not_applied_where_it_does_not_pay_or_is_turned_off():
    gen = torch.Generator().manual_seed(4)
    fam = FAMILIES["bert-mlm"]
    dense = ragged_batch([SEQ] * BATCH, "mlm", gen)
    sparse_labels = _ragged("mlm", gen, steps=1)[0]
    sparse_labels["labels"][:, 2:] = -100  # masked-LM labels: ORT's label sparsity shrinks the head instead
    left = _ragged("mlm", gen, steps=1, pad_left=True)[0]  # a causal shift would read a padding position
    for batch, options in (
        (dense, STRICT),
        (sparse_labels, STRICT),
        (left, STRICT),
        (_ragged("mlm", gen, steps=1)[0], ORTOptions(fallback="disable", eliminate_padding=False)),
    ):
        wrapped = wrap_model(build(fam), options)
        wrapped.train()
        wrapped(**batch).loss.backward()
        assert wrapped.engine_status().backend == "ort" and wrapped.padding_rewrite is None
        assert _unpadded_matmuls(wrapped) == 0


def test_a_batch_labelling_padding_is_refused_once_the_graph_eliminates_it():
    gen = torch.Generator().manual_seed(5)
    fam = FAMILIES["llama-clm"]  # a class the sweep proved elimination exact for: on by default
    wrapped = wrap_model(build(fam), STRICT)
    wrapped.train()
    first, second = _ragged("clm", gen, steps=2)
    wrapped(**first).loss.backward()
    assert wrapped.padding_rewrite is not None
    left = _ragged("clm", gen, steps=1, pad_left=True)[0]
    second["labels"] = second["input_ids"].clone()  # labels on the padding too
    for batch in (second, left):
        with pytest.raises(ValueError, match="eliminate_padding"):
            wrapped(**batch)


def test_asking_for_it_on_cuda_is_refused(monkeypatch):
    from ort_hf.engine import placement
    from ort_hf.engine.wrap_settings import WrapSettings

    model = build(FAMILIES["bert-cls"])
    monkeypatch.setattr(placement, "model_device_type", lambda module: "cuda")
    with pytest.raises(ValueError, match="never run on a GPU"):
        WrapSettings.of(model, ORTOptions(eliminate_padding=True), state=None)


def test_an_evaluation_in_ort_leaves_the_guard_in_place():
    # ORT builds an inference graph for eval_in_ort; the training graph stays rewritten, and so
    # must its guard against batches it cannot train exactly.
    gen = torch.Generator().manual_seed(6)
    options = ORTOptions(fallback="disable", log_level="ERROR", eval_in_ort=True, eliminate_padding=True)
    wrapped = wrap_model(build(FAMILIES["bert-mlm"]), options)
    wrapped.train()
    first = _ragged("mlm", gen, steps=1)[0]
    wrapped(**first).loss.backward()
    assert wrapped.padding_rewrite is not None
    wrapped.eval()
    with torch.no_grad():
        wrapped(**first)
    wrapped.train()
    assert wrapped.padding_rewrite is not None
    with pytest.raises(ValueError, match="eliminate_padding"):
        wrapped(**_ragged("mlm", gen, steps=1, pad_left=True)[0])


def test_the_word_embeddings_gradient_buffer_outlives_many_row_counts():
    # Elimination's row gathers change size with every batch's real-token count; the embedding
    # kernel's kept buffers must still serve the vocabulary table (else it is faulted in anew).
    from ort_hf.module_with_loss import ModuleWithLoss

    model = build(FAMILIES["bert-cls"])  # untied: the gradient ORT returns is the kernel's buffer
    options = ORTOptions(fallback="disable", log_level="ERROR", preflight="never", eliminate_padding=True)
    wrapped = wrap_model(ModuleWithLoss(model), options)
    wrapped.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen, storages = torch.Generator().manual_seed(9), set()
    for step in range(12):  # 12 real-token counts, more than the kernel keeps buffers
        wrapped(**ragged_batch([SEQ, 3 + step, 8, 8], "cls", gen))["loss"].backward()
        storages.add(model.bert.embeddings.word_embeddings.weight.grad.untyped_storage().data_ptr())
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert wrapped.padding_rewrite is not None and wrapped._record.swapped["ATen"] == 3
    assert len(storages) <= 2, f"the word embeddings' gradient took {len(storages)} buffers in 12 steps"
