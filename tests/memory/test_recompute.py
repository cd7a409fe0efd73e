"""Recompute levels and plans: same losses as PyTorch, a plan table that matches ORT's, clear typos."""

import os
import re

import pytest
import torch
from parity import assert_parity, run_parity
from transformers import AutoTokenizer, BertForSequenceClassification

from ort_hf.engine import ORTOptions, wrap_model

SENTENCES = [
    "a warm , funny and deeply moving film",
    "the plot is thin and the jokes fall flat",
    "one of the best performances of the year",
    "tedious , overlong and badly acted",
]


@pytest.fixture(scope="module")
def minilm_batches(minilm_dir):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    enc = tok(SENTENCES, padding="max_length", max_length=24, truncation=True, return_tensors="pt")
    batch = {**enc, "labels": torch.tensor([1, 0, 1, 0])}
    return [batch] * 20


def _minilm(minilm_dir):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return model.train()


@pytest.mark.parametrize(
    "memory",
    [
        {"memory_opt_level": 0},
        {"memory_opt_level": 1},
        {"memory_opt_level": 2},
        {"memory_opt_plans": ("LayerNormalization+:1:-1",)},
    ],
    ids=["level0", "level1", "level2", "plan"],
)
def test_recompute_keeps_pytorch_losses(minilm_dir, minilm_batches, memory):
    options = ORTOptions(fallback="disable", log_level="ERROR", **memory)
    result = run_parity(_minilm(minilm_dir), minilm_batches, options=options, lr=5e-5)
    assert_parity(*result)
    plans = result[-1].memory_plans()
    enabled = [p.plan for p in plans if p.enabled]
    if memory.get("memory_opt_level"):
        assert enabled, "a recompute level turned no plan on"
    elif "memory_opt_plans" in memory:
        assert enabled == ["LayerNormalization+:1:-1"]
    else:
        assert not enabled


def test_plan_table_matches_what_ort_reports(minilm_dir, minilm_batches):
    model = _minilm(minilm_dir)
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR", memory_opt_level=1))
    wrapped.train()
    wrapped(**minilm_batches[0]).loss.backward()
    ours = wrapped.memory_plans()
    manager = wrapped._ort._torch_module._execution_manager(True)
    _, table = manager._runtime_inspector.memory_ob.display_memory_optimization_plans(
        manager._runtime_options.memory_optimizer_config_file_path, details=True
    )
    # ORT's own table rows: " - Plan N  :  ON|OFF  :  <plan>  <freq>  <bytes>  <symbolic>"
    reported = {
        m.group(2): (m.group(1) == "ON", int(m.group(3)), float(m.group(4).replace(",", "")))
        for m in re.finditer(r":\s+(ON|OFF)\s+:\s+(\S+)\s+(\d+)\s+([\d,.]+)", table.get_string())
    }
    assert reported and len(reported) == len(ours)
    for plan in ours:
        assert reported[plan.plan] == (plan.enabled, plan.frequency, plan.bytes_saved), plan


def test_a_mistyped_plan_lists_the_valid_ones(minilm_dir, minilm_batches):
    model = _minilm(minilm_dir)
    typo = ORTOptions(fallback="disable", log_level="ERROR", memory_opt_plans=("LayerNormalisation+:1:-1",))
    wrapped = wrap_model(model, typo)
    wrapped.train()
    expected = r"no plan 'LayerNormalisation\+:1:-1'.*Did you mean 'LayerNormalization\+:1:-1'.*Valid plans: .*Gather"
    with pytest.raises(ValueError, match=expected):
        wrapped(**minilm_batches[0])


def test_the_plan_file_lives_as_long_as_the_session(minilm_dir, minilm_batches):
    """ORT reads chosen plans from a JSON file at every session build; it is removed with the session."""
    wrapped = wrap_model(
        _minilm(minilm_dir),
        ORTOptions(fallback="disable", log_level="ERROR", memory_opt_plans=("LayerNormalization+:1:-1",)),
    )
    wrapped.train()
    wrapped(**minilm_batches[0]).loss.backward()
    manager = wrapped._ort._torch_module._execution_manager(True)
    path = manager._runtime_options.memory_optimizer_config_file_path
    assert path and os.path.exists(path) and wrapped.engine_status().backend == "ort"
    del manager
    wrapped.release()
    assert not os.path.exists(path)


def _tiny_bert_step(monkeypatch, original_create: bool):
    """One ORT training step of a tiny BERT at recompute level 0: its loss, its gradients, the plans
    ORT found, and how many sessions were built (ORT's own _create_execution_agent if asked)."""
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()  # ORT imported with ort_hf's bridges (its modules do not import on torch 2.13 alone)
    from onnxruntime.training.ortmodule import _training_manager
    from onnxruntime.training.ortmodule._runtime_inspector import MemoryObserver
    from transformers import BertConfig

    built, plan_reads = [], []
    find = MemoryObserver.find_memory_optimization_opportunity
    monkeypatch.setattr(
        MemoryObserver, "find_memory_optimization_opportunity", lambda *a, **k: plan_reads.append(1) or find(*a, **k)
    )

    class CountedAgent(_training_manager.TrainingAgent):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_training_manager, "TrainingAgent", CountedAgent)
    if original_create:  # ORT's method, unwrapped (functools.wraps keeps it as __wrapped__)
        manager = _training_manager.TrainingManager
        monkeypatch.setattr(manager, "_create_execution_agent", manager._create_execution_agent.__wrapped__)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForSequenceClassification(config).train()
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR"))
    ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(1))
    loss = wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids[:, 0] % 2).loss
    loss.backward()
    assert wrapped.engine_status().backend == "ort"
    # ORT reads the plans when it builds its sessions; ort_hf when they are asked for (below).
    assert len(plan_reads) == (1 if original_create else 0)
    grads = [p.grad.clone() for p in model.parameters()]
    return loss.item(), grads, wrapped.memory_plans(), len(built)


def test_without_recompute_one_session_is_built_and_the_plans_are_ort_s(monkeypatch):
    """ORT builds a session only to read the recompute plans, then the training session; with no
    recompute asked for, ort_hf reads them from the training session, when asked for: the same
    plans, one build."""
    loss, grads, plans, built = _tiny_bert_step(monkeypatch, original_create=False)
    with monkeypatch.context() as ort_own:
        ort_loss, ort_grads, ort_plans, ort_built = _tiny_bert_step(ort_own, original_create=True)
    assert (built, ort_built) == (1, 2)
    assert plans and not any(p.enabled for p in plans + ort_plans)
    assert sorted((p.plan, p.frequency) for p in plans) == sorted((p.plan, p.frequency) for p in ort_plans)
    # ORT's byte estimate for a plan found at several places (LayerNormalization+, x5) reads one of
    # them, not always the same: ORT's own two-session order gave 608, 6,560 and 12,512 run to run.
    once = {p.plan: p.bytes_saved for p in plans if p.frequency == 1}
    assert once == {p.plan: p.bytes_saved for p in ort_plans if p.frequency == 1}
    assert loss == ort_loss
    for a, b in zip(grads, ort_grads):  # two sessions, not one graph's bits: a sum's order can differ
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
