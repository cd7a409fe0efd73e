"""ORTTrainingArguments: flags from the command line, validation naming the flag, ORTOptions mirror."""

import dataclasses
import json
import re
import tempfile

import pytest
from transformers import HfArgumentParser

from ort_hf.engine import ORTOptions
from ort_hf.trainer import ADAMW_ORT_FUSED, ORTTrainingArguments

OUT = tempfile.mkdtemp(prefix="ort_hf_args-")  # never written: arguments only


def _parse(*argv):
    (args,) = HfArgumentParser(ORTTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", OUT, "--report_to", "none", *argv]
    )
    return args


def test_every_ort_option_has_a_flag():
    arg_fields = {f.name for f in dataclasses.fields(ORTTrainingArguments)}
    for f in dataclasses.fields(ORTOptions):
        assert f"ort_{f.name}" in arg_fields
        meta = next(a for a in dataclasses.fields(ORTTrainingArguments) if a.name == f"ort_{f.name}").metadata
        assert meta.get("help"), f"--ort_{f.name} has no help text"


def test_command_line_flags_reach_ort_options():
    with pytest.raises(ValueError, match="--ort_memory_opt_level and --ort_memory_opt_plans"):
        _parse("--ort_memory_opt_level", "1", "--ort_memory_opt_plans", "BiasGelu+:1:-1")
    args = _parse("--ort_memory_opt_level", "2", "--ort_enable_label_sparsity", "false", "--optim", ADAMW_ORT_FUSED)
    options = args.ort_options()
    assert options.memory_opt_level == 2 and options.enable_label_sparsity is False
    assert args.optim == ADAMW_ORT_FUSED and args.use_ort is True and args.use_module_with_loss is True


def test_length_grouped_batches_leave_padding_elimination_off_unless_asked():
    assert _parse().ort_options().eliminate_padding is None  # decided on the batch that builds the graph
    assert _parse("--train_sampling_strategy", "group_by_length").ort_options().eliminate_padding is False
    asked = _parse("--train_sampling_strategy", "group_by_length", "--ort_eliminate_padding", "true")
    assert asked.ort_options().eliminate_padding is True


def test_plans_parse_as_a_list():
    args = _parse("--ort_memory_opt_plans", "BiasGelu+:1:-1", "Gelu+:1:-1")
    assert args.ort_options().memory_opt_plans == ("BiasGelu+:1:-1", "Gelu+:1:-1")


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--ort_memory_opt_level", "5"),
        ("--ort_opset_version", "11"),
        ("--ort_fallback", "maybe"),
        ("--ort_log_level", "CHATTY"),
        ("--ort_loss_in_graph", "sometimes"),
        ("--use_ort", "sometimes"),
    ],
)
def test_choices_are_argparse_choices_on_the_command_line_and_checked_in_python(flag, value, capsys):
    with pytest.raises(SystemExit):
        _parse(flag, value)
    assert re.search(rf"argument {flag}/\S+: invalid choice: '?{value}'?", capsys.readouterr().err)
    field = flag.removeprefix("--")
    typed = int(value) if field in ("ort_memory_opt_level", "ort_opset_version") else value
    with pytest.raises(ValueError, match=f"{flag} must be one of"):
        ORTTrainingArguments(output_dir=OUT, report_to=[], **{field: typed})


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--ort_memory_opt_plans", "typo"], "--ort_memory_opt_plans"),
        (["--ort_onnx_dir", OUT], "--ort_onnx_dir"),
        (["--ort_mem_efficient_grad_mgmt", "--ddp_find_unused_parameters", "true"], "--ddp_find_unused_parameters"),
        (["--ort_density_print_every", "0"], "--ort_density_print_every"),
        (["--ort_memory_budget_mb", "-100"], "--ort_memory_budget_mb"),
        (["--ort_memory_budget_mb", "900", "--ort_memory_callback", "false"], "--ort_memory_callback"),
        (["--fsdp", "full_shard"], "--use_ort false"),
    ],
)
def test_bad_values_name_the_flag(argv, flag):
    with pytest.raises(ValueError, match=flag):
        _parse(*argv)


def test_fused_optimizer_with_bf16_says_what_to_change():
    with pytest.raises(ValueError, match="adamw_torch_fused"):
        ORTTrainingArguments(
            output_dir=OUT, optim=ADAMW_ORT_FUSED, bf16=True, use_cpu=True, report_to=[], use_ort=False
        )


def test_gradient_checkpointing_becomes_layerwise_recompute():
    args = ORTTrainingArguments(output_dir=OUT, gradient_checkpointing=True, report_to=[])
    assert not args.gradient_checkpointing and not args.activation_checkpointing
    assert args.ort_options().memory_opt_level == 1
    plain = ORTTrainingArguments(output_dir=OUT, gradient_checkpointing=True, use_ort=False, report_to=[])
    assert plain.activation_checkpointing  # PyTorch runs keep torch checkpointing


@pytest.mark.parametrize(
    "stage,extra,says",
    [
        (3, {}, "set zero_optimization.stage to 1 or 2"),
        (2, {"ort_mem_efficient_grad_mgmt": True}, "--ort_mem_efficient_grad_mgmt"),
        (2, {"ort_memory_budget_mb": 900}, "--ort_memory_budget_mb"),
    ],
)
def test_deepspeed_refuses_what_ort_cannot_do_under_it(tmp_path, stage, extra, says):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (it comes with the dev extra)")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    with pytest.raises(ValueError, match=says):
        ORTTrainingArguments(output_dir=str(tmp_path), deepspeed=str(config), use_cpu=True, report_to=[], **extra)
    if stage == 3:  # ZeRO-3 stays available on the PyTorch path
        ORTTrainingArguments(output_dir=str(tmp_path), deepspeed=str(config), use_cpu=True, report_to=[], use_ort=False)


def test_sharded_wrappers_stay_available_on_the_pytorch_path():
    args = _parse("--fsdp", "full_shard", "--use_ort", "false")
    assert args.fsdp and not args.use_ort


def _our_fields(kind):
    from transformers import TrainingArguments

    theirs = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f.name for f in dataclasses.fields(ORTTrainingArguments) if f.name not in theirs and kind in str(f.type)]


@pytest.mark.parametrize("name", _our_fields("bool"))
def test_every_switch_rejects_a_non_boolean_naming_the_flag(name, capsys):
    with pytest.raises(SystemExit):
        _parse(f"--{name}", "maybe")
    assert f"--{name}" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["ort_export_cache_dir", "ort_onnx_dir"])
def test_a_folder_flag_given_a_file_names_the_flag(name, tmp_path):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    extra = ["--ort_save_onnx", "true"] if name == "ort_onnx_dir" else []
    with pytest.raises(ValueError, match=f"--{name}.*is a file"):
        _parse(f"--{name}", str(a_file), *extra)


def test_memory_efficient_gradients_need_custom_autograd():
    with pytest.raises(ValueError, match="--ort_mem_efficient_grad_mgmt needs enable_custom_autograd"):
        _parse("--ort_mem_efficient_grad_mgmt", "true", "--ort_enable_custom_autograd", "false")


def test_memory_efficient_gradients_turn_off_ddp_unused_parameter_search():
    # DDP's search would mark every parameter unused, then ORT's param.backward(grad) ready again.
    assert _parse("--ort_mem_efficient_grad_mgmt").ddp_find_unused_parameters is False
    assert _parse().ddp_find_unused_parameters is None  # untouched otherwise: the Trainer decides


@pytest.mark.parametrize("flag", ["bf16", "fp16"])
def test_mixed_precision_on_cpu_is_refused_with_what_to_do(flag):
    with pytest.raises(ValueError, match=f"--{flag} with ORT on CPU.*--use_ort false"):
        ORTTrainingArguments(output_dir=OUT, use_cpu=True, report_to=[], **{flag: True})
    if flag == "bf16":  # the PyTorch path keeps the Trainer's behaviour
        assert ORTTrainingArguments(output_dir=OUT, use_cpu=True, report_to=[], bf16=True, use_ort=False).bf16


def test_bf16_with_ort_on_cuda_is_refused_with_what_to_do(monkeypatch):
    """ORT 1.19.2 has no bfloat16 CUDA kernels for ops bf16 training graphs contain (engine/precision.py)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="bfloat16 with ORT on CUDA.*--fp16 through ORT.*--use_ort false"):
        ORTTrainingArguments(output_dir=OUT, report_to=[], bf16=True)


def test_torch_compile_with_ort_is_refused():
    with pytest.raises(ValueError, match="--torch_compile with ORT.*--use_ort false"):
        ORTTrainingArguments(output_dir=OUT, use_cpu=True, report_to=[], torch_compile=True)


def test_every_ort_option_is_declared_once():
    """--ort_<field> takes ORTOptions.<field>'s default and help: no second declaration to drift."""
    from dataclasses import MISSING, fields

    args = {f.name: f for f in fields(ORTTrainingArguments)}
    for option in fields(ORTOptions):
        arg = args[f"ort_{option.name}"]
        assert arg.metadata["help"] == option.metadata["help"] and option.metadata["help"], option.name
        if option.default_factory is not MISSING:
            assert list(option.default_factory()) == arg.default_factory(), option.name
        else:
            assert arg.default == option.default, option.name
    assert ORTTrainingArguments(output_dir=OUT, report_to=[]).ort_options() == ORTOptions()


@pytest.mark.parametrize(
    ("argv", "value"),
    [([], None), (["--ort_chunked_lm_loss"], True), (["--ort_chunked_lm_loss", "false"], False)],
    ids=["default-proven-classes", "alone-means-true", "false"],
)
def test_the_fused_lm_loss_flag_has_three_states(argv, value):
    assert _parse(*argv).ort_chunked_lm_loss is value
