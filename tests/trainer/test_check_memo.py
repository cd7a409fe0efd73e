"""The first-batch checks' outcomes, recorded in the export cache folder, stand in for their forwards
in a later run only when everything that decides them is the same, and only as recorded."""

import json

import pytest
import torch
from tiny_models import FAMILIES, build, make_batch, tiny_args

from ort_hf.engine import first_batch_memo
from ort_hf.module_with_loss import ModuleWithLoss
from ort_hf.module_with_loss.chunked_head import chunked_head_refusal
from ort_hf.module_with_loss.loss_choice import choose_loss


def _counted(model):
    """The calls of the model's forward and of its backbone's alone."""
    calls, inside = [], []
    model.register_forward_pre_hook(lambda *_: (calls.append("model"), inside.append(1)) and None)
    model.register_forward_hook(lambda *_: inside.pop() and None)
    getattr(model, model.base_model_prefix).register_forward_pre_hook(
        lambda *_: None if inside else calls.append("backbone")
    )
    return calls


def _batch(task="clm"):
    return make_batch(task, torch.Generator().manual_seed(0), padded=False)


def _fresh_choice(family, folder, batch, **module_kw):
    """``choose_loss`` and ``chunked_head_refusal`` on a new model and memo (as a new run builds them),
    and the model forwards they ran."""
    model = build(FAMILIES[family])
    calls = _counted(model)
    module = ModuleWithLoss(model, **module_kw)
    memo = first_batch_memo(str(folder), model)
    choice = choose_loss(module, batch, None, memo)
    module.use(choice)
    refusal = chunked_head_refusal(module, batch, True, memo)
    return choice, refusal, len(calls)


def test_a_later_run_takes_the_recorded_outcomes_and_runs_no_forward(tmp_path):
    first = _fresh_choice("llama-clm", tmp_path, _batch())
    assert first[0].kind == "cross_entropy" and first[1] is None and first[2] == 3  # loss check, logits, backbone
    again = _fresh_choice("llama-clm", tmp_path, _batch())
    assert again[:2] == first[:2] and again[2] == 0
    assert len(list((tmp_path / "first-batch-checks").glob("*.json"))) == 2 + 1  # two checks and the manifest


def test_without_a_cache_folder_every_check_runs(tmp_path):
    model = build(FAMILIES["llama-clm"])
    calls = _counted(model)
    assert first_batch_memo(None, model) is None
    module = ModuleWithLoss(model)
    choose_loss(module, _batch(), None, None)
    choose_loss(module, _batch(), None, None)
    assert len(calls) == 2


def test_anything_that_decides_the_outcome_runs_the_checks_again(tmp_path):
    _fresh_choice("llama-clm", tmp_path, _batch())
    # other settings of the Trainer's loss, another model, another layout of the rows
    assert _fresh_choice("llama-clm", tmp_path, _batch(), model_accepts_loss_kwargs=False)[2] >= 1
    assert _fresh_choice("gpt2-clm", tmp_path, _batch())[2] >= 1
    batch = _batch()
    del batch["attention_mask"]
    assert _fresh_choice("llama-clm", tmp_path, batch)[2] >= 1
    # the model changed in code-visible structure (a dropout probability in its config)
    model = build(FAMILIES["llama-clm"])
    model.config.attention_dropout = 0.25
    calls = _counted(model)
    choose_loss(ModuleWithLoss(model), _batch(), None, first_batch_memo(str(tmp_path), model))
    assert len(calls) == 1


def test_an_outcome_that_is_not_the_file_recorded_is_not_taken(tmp_path):
    """A planted or edited outcome (here: a weighted loss recorded as plain cross-entropy) is ignored."""
    model = build(FAMILIES["bert-cls"])
    model.config.problem_type = "single_label_classification"
    batch = _batch("cls")
    choice, _, ran = _fresh_choice("bert-cls", tmp_path, batch)
    assert ran >= 1 and choice.kind == "cross_entropy"
    (recorded,) = (tmp_path / "first-batch-checks").glob("loss_choice-*.json")
    planted = {"kind": "model", "reason": "planted", "per_num_items": True}
    recorded.write_text(json.dumps({"outcome": planted, "config_changes": {}}))
    choice, _, ran = _fresh_choice("bert-cls", tmp_path, batch)
    assert ran >= 1 and choice.kind == "cross_entropy" and choice.reason is None


def test_a_check_that_raises_records_nothing(tmp_path):
    """A model without labels must return its own loss; one that does not raises each time."""
    model = build(FAMILIES["llama-clm"])
    batch = _batch()
    del batch["labels"]
    module = ModuleWithLoss(model)
    for _ in range(2):
        try:
            choose_loss(module, batch, None, first_batch_memo(str(tmp_path), model))
        except (ValueError, TypeError, KeyError) as exc:
            assert "loss" in str(exc)
        else:
            raise AssertionError("a model that returns no loss was accepted")
    assert not list((tmp_path / "first-batch-checks").glob("returns_loss-*.json"))


def test_the_config_fields_a_check_sets_are_set_again(tmp_path):
    """A classifier's first forward sets ``config.problem_type`` (so the saved config.json says it);
    a run that takes the recorded outcome sets it too, without the forward."""
    batch = _batch("cls")
    for expected_forwards in (1, 0):
        model = build(FAMILIES["bert-cls"])
        model.config.problem_type = None
        calls = _counted(model)
        choose_loss(ModuleWithLoss(model), batch, None, first_batch_memo(str(tmp_path), model))
        assert len(calls) == expected_forwards
        assert model.config.problem_type == "single_label_classification"


@pytest.mark.parametrize("family", ["llama-clm", "bert-cls"])
def test_ort_trainer_records_the_checks_in_the_export_cache(tmp_path, family):
    """End to end: ORTTrainer with --ort_export_cache_dir; the second run in the same folder loads the
    graph and the checks' outcomes, so the model's PyTorch forward never runs, and it trains and
    configures the model as the first."""
    from tiny_models import id_dataset, rule_labels

    from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

    data = id_dataset(8, labels=(lambda ids, gen: ids) if family == "llama-clm" else rule_labels)
    logs, forwards, configs = [], [], []
    for run in range(2):
        model = build(FAMILIES[family])
        model.config.problem_type = None
        calls = _counted(model)
        args = tiny_args(
            ORTTrainingArguments,
            tmp_path / f"out{run}",
            max_steps=2,
            per_device_train_batch_size=4,
            ort_export_cache_dir=str(tmp_path / "cache"),
        )
        trainer = ORTTrainer(model=model, args=args, train_dataset=data)
        trainer.train()
        logs.append([e for e in trainer.state.log_history if "loss" in e])
        forwards.append(len(calls))
        configs.append(model.config.to_dict())
    assert forwards[0] >= 2 and forwards[1] == 0, forwards  # the loss check and the export's trace, then none
    assert logs[0][0]["ort/export_s"] > 0 and logs[1][0]["ort/export_s"] == 0  # the second loads the graph
    assert [e["loss"] for e in logs[0]] == [e["loss"] for e in logs[1]]
    assert configs[0] == configs[1]
