"""Recompute levels and plans: same losses as PyTorch, a plan table that matches ORT's, clear typos."""

import pytest
import torch
from parity import assert_parity, run_parity
from transformers import AutoTokenizer, BertForSequenceClassification

from ort_hf.engine import ORTOptions, wrap_model

SENTENCES = [
    "a warm , funny and deeply moving film", "the plot is thin and the jokes fall flat",
    "one of the best performances of the year", "tedious , overlong and badly acted",
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
    "memory", [{"memory_opt_level": 0}, {"memory_opt_level": 1}, {"memory_opt_level": 2},
               {"memory_opt_plans": ("Gelu+:1:-1",)}],
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
        assert enabled == ["Gelu+:1:-1"]
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
    rows = table.get_string().splitlines() if hasattr(table, "get_string") else str(table).splitlines()
    text = "\n".join(rows)
    for plan in ours:
        line = next(r for r in rows if plan.plan in r)
        assert ("ON" if plan.enabled else "OFF") in line and f"{plan.bytes_saved:,.0f}" in line, (plan, line)
    assert len(ours) == text.count(" - Plan ")


def test_a_mistyped_plan_lists_the_valid_ones(minilm_dir, minilm_batches):
    model = _minilm(minilm_dir)
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR", memory_opt_plans=("Gelux+:1:-1",)))
    wrapped.train()
    with pytest.raises(ValueError, match=r"no plan 'Gelux\+:1:-1'.*Did you mean 'Gelu\+:1:-1'.*Valid plans: .*Gelu\+:1:-1"):
        wrapped(**minilm_batches[0])
