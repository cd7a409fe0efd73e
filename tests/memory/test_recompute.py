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
