"""The architecture sweep on a fixed sample, through the worker processes `ort-hf sweep` uses, plus
its two pure parts on hand-made inputs: the tiny-config shrinker and the cell classifier."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ort_hf.engine import ORTFallbackError
from ort_hf.sweep.cells import (
    EXACT_GRAD_REL,
    FLOOR_MAX,
    LOSS_ATOL,
    REWRITES_GRAD_REL,
    classify,
    rewrite_bound,
    rewrites_proven,
)
from ort_hf.sweep.recording import describe_exception, gradient_errors
from ort_hf.sweep.render import markdown, proven_lists, shipped_result
from ort_hf.sweep.runner import run_case
from ort_hf.sweep.tiny_config import DEPTHS, HEAD_COUNTS, HEADS, LAYERS, VOCAB, size_problems, tiny_config
from ort_hf.sweep.waits_for import waits_for

SAMPLE = {("seq-cls", "bert"): "BertForSequenceClassification", ("causal-lm", "gpt2"): "GPT2LMHeadModel"}


def test_sample_cases_train_through_ort_at_parity(tmp_path):
    # Two cases at once, each in its own worker process, as `ort-hf sweep --jobs 2` runs them.
    with ThreadPoolExecutor(max_workers=2) as pool:
        records = list(pool.map(lambda case: run_case(*case, ["default"], 240.0, tmp_path / f"{case[1]}.log"), SAMPLE))
    for (task, model_type), record in zip(SAMPLE, records):
        result = record["modes"]["default"]
        assert record["reference"]["status"] == "ok", record["reference"]
        assert 0 < record["reference"]["fp32_grad_floor"] < 1e-5  # PyTorch's own float32 against float64
        assert record["model_class"] == SAMPLE[task, model_type]
        assert result["cell"] == "parity", (
            task,
            model_type,
            result,
            (tmp_path / f"{model_type}.log").read_text()[-3000:],
        )
        assert result["backend"] == "ort" and result["export_s"] > 0  # ORT exported and ran the steps
        assert result["swapped"].get("Gemm (weight gradient)", 0) >= 1  # the sweep's tiny weights move too
        padding = result["padding"]  # what the padding rewrites did, recorded per run
        assert set(padding) == {"kept_tokens", "total_tokens", "unpadded_nodes"}
        assert padding["kept_tokens"] <= padding["total_tokens"] and padding["unpadded_nodes"] >= 0
        assert len(result["ort_losses"]) == len(result["trainer_losses"]) == 4
        assert result["max_loss_diff"] <= LOSS_ATOL
        assert result["grad_rel_error"] <= EXACT_GRAD_REL


@pytest.mark.parametrize(
    "model_type",
    ["bert", "gpt2", "llama", "t5", "bart", "mixtral", "gemma3_text", "distilbert", "deberta-v2", "qwen2_moe"],
)
def test_tiny_config_is_tiny_and_consistent(model_type):
    config, specials = tiny_config(model_type, ("mask", "decoder_start"), num_labels=3)
    assert size_problems(config) == []  # every size attribute at most its tiny value, heads divide the width
    text = config.get_text_config(decoder=True)
    assert text.vocab_size <= VOCAB
    assert all(0 <= i < text.vocab_size for i in specials.by_name.values()), specials.by_name
    assert config.pad_token_id is not None and "mask" in specials.by_name
    depth = next(getattr(text, n) for n in DEPTHS if isinstance(vars(text).get(n), int))
    assert depth <= LAYERS + 2
    heads = [vars(text)[n] for n in HEAD_COUNTS if isinstance(vars(text).get(n), int)]
    assert heads and max(heads) <= HEADS
    for name, value in vars(text).items():
        if isinstance(value, float) and "drop" in name:
            assert value == 0.0, name
    if getattr(text, "layer_types", None) is not None:
        assert len(text.layer_types) == depth


def test_size_problems_sees_what_the_shrinker_must_not_leave():
    from transformers import BertConfig

    assert size_problems(BertConfig(hidden_size=64, num_attention_heads=3, num_hidden_layers=2)) != []
    assert size_problems(
        BertConfig(
            vocab_size=256,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=3072,
            num_hidden_layers=2,
            max_position_embeddings=128,
        )
    ) == ["intermediate_size=3072 > 128"]


def test_tiny_config_keeps_one_layer_of_each_kind():
    # gemma3's sixth layer is its first full-attention one: the tiny model keeps both kinds.
    config, _ = tiny_config("gemma3_text")
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert config.num_hidden_layers == len(config.layer_types)


def test_tiny_config_moves_large_special_ids_below_the_vocabulary():
    config, specials = tiny_config("gpt2")
    assert config.bos_token_id == config.eos_token_id < config.vocab_size  # 50256 both, still equal
    assert config.pad_token_id not in (config.eos_token_id, None)


REFERENCE = {"status": "ok", "losses": [1.0, 0.9, 0.8, 0.7]}


def _run(**facts):
    return {"losses": list(REFERENCE["losses"]), "steps_done": 4, "error": None, "backend": "ort", **facts}


def test_classifier_on_hand_made_records():
    assert classify(REFERENCE, _run())["cell"] == "parity"
    off = classify(REFERENCE, _run(losses=[1.0, 0.9 + 2e-4, 0.8, 0.7]))
    assert off["cell"] == "diverge" and off["step"] == 2 and math.isclose(off["max_loss_diff"], 2e-4, rel_tol=1e-3)
    nan = classify(REFERENCE, _run(losses=[1.0, math.nan, 0.8, 0.7]))
    assert nan["cell"] == "diverge" and nan["step"] == 2
    after_one = _run(losses=[1.0], steps_done=1, error={"message": "boom", "from_ort_hf": False})
    crash = classify(REFERENCE, after_one)
    assert crash["cell"] == "crash" and crash["step"] == 2
    assert classify({"status": "ok", "losses": [1.0, math.inf, 0.8, 0.7]}, _run())["cell"] == "not-counted"
    assert classify({"status": "not-counted", "reason": "model: x"}, _run())["cell"] == "not-counted"
    first = {"losses": [], "steps_done": 0}
    assert classify(REFERENCE, {**first, "error": {"message": "ort_hf: no", "from_ort_hf": True}})["cell"] == "refused"
    assert classify(REFERENCE, {**first, "error": {"message": "x", "from_ort_hf": False}})["cell"] == "crash-step1"
    assert classify(REFERENCE, {**first, "killed": "timeout"})["cell"] == "timeout"
    assert classify(REFERENCE, {"losses": [1.0, 0.9], "steps_done": 2, "killed": "timeout"})["cell"] == "crash"
    assert classify(REFERENCE, {**first, "killed": "died"})["cell"] == "crash-step1"
    assert classify(REFERENCE, _run(backend="pytorch"))["cell"] != "parity"  # ORT must be shown to have run
    assert classify(REFERENCE, _run(batches_differ_at_step=3))["cell"] == "not-counted"


def test_exceptions_from_ort_hf_count_as_refusals():
    try:
        try:
            raise ORTFallbackError("ORT could not run M and fallback is disabled: unsupported op aten::x")
        except ORTFallbackError as inner:
            raise RuntimeError("ORT failed at step 1: ORT could not run M ...") from inner
    except RuntimeError as exc:
        described = describe_exception(exc, 0)
    assert described["from_ort_hf"] and described["ort_hf_error"] == "ORTFallbackError"
    assert described["message"].startswith("ORT failed at step 1")
    assert not describe_exception(RuntimeError("Error in backward pass execution"), 0)["from_ort_hf"]


def test_gradient_errors_overall_and_worst_parameter():
    ref = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, 0.0])}
    got = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, 0.5])}
    errors = gradient_errors(ref, got)
    assert math.isclose(errors["grad_rel_error"], 0.5 / math.sqrt(26))
    assert errors["worst_param"] == "b" and math.isclose(errors["worst_param_rel_error"], 0.5)


def _record(model_type, model_class, raw_cell, raw_grads, rewrites_grads):
    mode = {"trainer_losses": [1.0], "ort_losses": [1.0], "detail": None, "step": None, "wall_s": 1.0}
    return {
        "task": "seq-cls",
        "model_type": model_type,
        "model_class": model_class,
        "wall_s": 9.0,
        "reference": {"status": "ok", "wall_s": 1.0},
        "modes": {
            "default": {**mode, "cell": "parity", "grad_rel_error": raw_grads},
            "raw": {**mode, "cell": raw_cell, "grad_rel_error": raw_grads},
            "rewrites": {
                **mode,
                "cell": "parity",
                "grad_rel_error": rewrites_grads,
                "padding": {"kept_tokens": 30, "total_tokens": 40, "unpadded_nodes": 12},
            },
        },
    }


def test_render_lists_only_what_the_thresholds_prove():
    results = {
        "seq-cls": {
            "bert": _record("bert", "BertForSequenceClassification", "parity", 1e-7, 1e-7),
            "convbert": _record("convbert", "ConvBertForSequenceClassification", "parity", 6e-3, 6e-3),
            "gpt2": _record("gpt2", "GPT2ForSequenceClassification", "parity", 1e-7, 5e-5),
        }
    }
    proven = proven_lists(results)
    assert proven["exact"] == ["BertForSequenceClassification", "GPT2ForSequenceClassification"]
    assert proven["trim_padding"] == proven["eliminate_padding"] == ["BertForSequenceClassification"]
    text = markdown(results)
    assert "| bert | parity |" in text and "parity (step-1 gradients off by 6.0e-03)" in text


def test_render_says_what_each_type_not_at_parity_waits_for():
    refused = _record("llama4_text", "Llama4ForCausalLM", "refused", None, None)
    refused["modes"]["default"]["cell"] = "refused"
    unknown = _record("newtype", "NewTypeForSequenceClassification", "refused", None, None)
    unknown["modes"]["default"]["cell"] = "timeout"
    results = {
        "seq-cls": {
            "bert": _record("bert", "BertForSequenceClassification", "parity", 1e-7, 1e-7),
            "llama4_text": refused,
            "newtype": unknown,
        }
    }
    waiting = markdown(results).split("## Not at parity")[1].split("## Model types")[0]
    assert f"| llama4_text | seq-cls (refused) | {waits_for('llama4_text')} |" in waiting
    assert "polar" in waits_for("llama4_text")
    assert "| newtype | seq-cls (timeout) | not diagnosed yet |" in waiting
    assert "| bert |" not in waiting


@pytest.mark.parametrize(
    ("padding", "proven"),
    [
        ({"kept_tokens": 40, "total_tokens": 40, "unpadded_nodes": 12}, ("eliminate_padding",)),
        ({"kept_tokens": 30, "total_tokens": 40, "unpadded_nodes": 0}, ("trim_padding",)),
        ({"kept_tokens": 30, "total_tokens": 40, "unpadded_nodes": 12}, ("trim_padding", "eliminate_padding")),
        ({"kept_tokens": 40, "total_tokens": 40, "unpadded_nodes": 0}, ()),  # nothing to rewrite
        (None, ()),  # a run that did not record what the rewrites did
    ],
    ids=["eliminated", "trimmed", "both", "did-nothing", "not-recorded"],
)
def test_each_padding_rewrite_is_proven_only_where_it_acted(padding, proven):
    run = {"cell": "parity", "grad_rel_error": 0.0}
    if padding is not None:
        run["padding"] = padding
    assert rewrites_proven(run) == proven
    assert rewrites_proven({**run, "grad_rel_error": 2e-5}) == ()  # acted, but the gradients moved


def test_a_class_that_heads_two_tasks_is_listed_only_if_neither_counts_against_it():
    good = _record("bart", "BartForConditionalGeneration", "parity", 1e-7, 1e-7)
    bad = _record("bart", "BartForConditionalGeneration", "parity", 1e-7, 1e-7)
    bad["modes"]["rewrites"].update(cell="diverge", grad_rel_error=0.3)
    proven = proven_lists({"masked-lm": {"bart": good}, "seq2seq-lm": {"bart": bad}})
    assert proven["exact"] == ["BartForConditionalGeneration"]
    assert proven["trim_padding"] == proven["eliminate_padding"] == []
    idle = _record("bart", "BartForConditionalGeneration", "parity", 1e-7, 1e-7)
    idle["modes"]["rewrites"]["padding"] = {"kept_tokens": 40, "total_tokens": 40, "unpadded_nodes": 0}
    proven = proven_lists({"masked-lm": {"bart": good}, "seq2seq-lm": {"bart": idle}})  # a run that shows nothing
    assert proven["trim_padding"] == ["BartForConditionalGeneration"]


def _packed_record(chunked: dict) -> dict:
    """A causal-lm-packed record of LlamaForCausalLM whose chunked_lm_loss run is ``chunked``."""
    record = _record("llama", "LlamaForCausalLM", "parity", 1e-7, 1e-7)
    del record["modes"]["rewrites"]
    record["modes"]["chunked_lm_loss"] = {**record["modes"]["raw"], **chunked}
    return record


@pytest.mark.parametrize(
    ("chunked", "listed"),
    [
        ({"cell": "parity", "grad_rel_error": 1e-7, "chunked_lm_loss": True}, True),
        ({"cell": "parity", "grad_rel_error": 1e-7, "chunked_lm_loss": False}, False),  # kept in PyTorch
        ({"cell": "parity", "grad_rel_error": 2e-5, "chunked_lm_loss": True}, False),  # gradients moved
        ({"cell": "diverge", "grad_rel_error": 0.3, "chunked_lm_loss": True}, False),
    ],
    ids=["fused-exact", "not-fused", "gradients-off", "diverged"],
)
def test_the_fused_loss_is_proven_only_where_it_ran_and_held(chunked, listed):
    results = {"causal-lm-packed": {"llama": _packed_record(chunked)}}
    proven = proven_lists(results)
    assert proven["exact"] == ["LlamaForCausalLM"]
    assert proven["chunked_lm_loss"] == (["LlamaForCausalLM"] if listed else [])
    # What users get on dense labels is the fused run where it is listed, else the raw one.
    shown = shipped_result(results["causal-lm-packed"]["llama"], proven)
    assert shown is results["causal-lm-packed"]["llama"]["modes"]["chunked_lm_loss" if listed else "raw"]


@pytest.mark.parametrize(
    ("floor", "listed"),
    [(None, False), (1e-7, False), (1.8e-5, True), (math.inf, False), (1e-3, False)],
    ids=["no-floor-recorded", "well-conditioned", "float32-floor-2e-5", "float64-grads-zero", "float64-path-differs"],
)
def test_the_bound_widens_by_twice_the_models_float32_floor(floor, listed):
    # Gemma 4's tiny model: PyTorch's own float32 gradients are 1.8e-5 from float64's, ORT's 2.8e-5
    # from Trainer's; a well-conditioned model (floor 1e-7) at 2.8e-5 is off.
    record = _packed_record({"cell": "parity", "grad_rel_error": 2.8e-5, "chunked_lm_loss": True})
    record["modes"]["rewrites"] = {**record["modes"]["raw"], "cell": "parity", "grad_rel_error": 2.8e-5}
    record["modes"]["rewrites"]["padding"] = {"kept_tokens": 30, "total_tokens": 40, "unpadded_nodes": 0}
    record["reference"]["fp32_grad_floor"] = floor
    proven = proven_lists({"causal-lm-packed": {"llama": record}})
    assert proven["chunked_lm_loss"] == proven["trim_padding"] == (["LlamaForCausalLM"] if listed else [])
    widened = floor is not None and floor <= FLOOR_MAX
    assert rewrite_bound(floor) == (REWRITES_GRAD_REL + 2 * floor if widened else REWRITES_GRAD_REL)


def test_the_float32_floor_is_measured_against_float64():
    from ort_hf.sweep.cases import TASKS
    from ort_hf.sweep.worker import build_case, build_model, fp32_grad_floor

    case = build_case(TASKS["causal-lm-packed"], "llama")
    floor = fp32_grad_floor(case, build_model(case).state_dict())
    assert 0 < floor < 1e-5  # float32 rounding: never zero, far below the bound for a plain Llama


def test_a_fused_loss_run_against_a_class_in_any_task_unlists_it():
    good = _packed_record({"cell": "parity", "grad_rel_error": 1e-7, "chunked_lm_loss": True})
    bad = _packed_record({"cell": "crash", "grad_rel_error": None, "chunked_lm_loss": True})
    proven = proven_lists({"causal-lm-packed": {"llama": good}, "other": {"llama": bad}})
    assert proven["chunked_lm_loss"] == [] and proven["exact"] == ["LlamaForCausalLM"]


def test_packed_rows_give_dense_labels_and_change_length_between_batches():
    from ort_hf.engine import SPARSITY_THRESHOLD
    from ort_hf.sweep.cases import SETTINGS, TASKS
    from ort_hf.sweep.data import build_rows

    _, specials = tiny_config("llama", (), None)
    rows = build_rows(TASKS["causal-lm-packed"], specials, SETTINGS)
    lengths = [len(r["input_ids"]) for r in rows]
    batches = [lengths[i : i + SETTINGS.batch_size] for i in range(0, len(lengths), SETTINGS.batch_size)]
    assert all(len(set(b)) == 1 for b in batches)  # nothing for the collator to pad
    assert len({b[0] for b in batches}) > 1  # the graph sees more than one length
    assert min(lengths) >= SETTINGS.packed_min_len
    assert (SETTINGS.packed_min_len - 1) / SETTINGS.packed_min_len >= SPARSITY_THRESHOLD  # dense after the shift
