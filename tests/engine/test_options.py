"""ORTOptions validation, and wrap_model leaving the environment as it found it."""

import os

import pytest
import torch

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.engine.options import environment_for, scoped_environ

BAD_VALUES = [
    ("log_level", "LOUD"),
    ("fallback", "sometimes"),
    ("opset_version", 9),
    ("opset_version", 99),
    ("opset_version", "17"),
    ("save_onnx", "yes"),
    ("enable_compute_optimizer", 1),
    ("enable_label_sparsity", None),
    ("enable_embedding_sparsity", "no"),
    ("memory_opt_level", 3),
    ("memory_opt_plans", "BiasGelu+:1:-1"),
    ("memory_opt_plans", ["not a plan"]),
    ("deepcopy_before_export", 0),
    ("enable_custom_autograd", "on"),
    ("mem_efficient_grad_mgmt", 1),
    ("use_triton", "1"),
    ("use_triton", True),
    ("use_efficient_attention", 2),
    ("eval_in_ort", "false"),
    ("intra_op_threads", 0),
    ("intra_op_threads", "2"),
    ("intra_op_threads", True),
    ("intra_op_spinning", "no"),
    ("torch_threads_in_graph", -1),
    ("torch_threads_in_graph", "1"),
    ("torch_threads_in_graph", True),
]


@pytest.mark.parametrize("field,value", BAD_VALUES)
def test_bad_value_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"ORTOptions\.{field}"):
        ORTOptions(**{field: value})


def test_conflicting_options_say_what_to_change():
    with pytest.raises(ValueError, match="set either a level"):
        ORTOptions(memory_opt_level=1, memory_opt_plans=["BiasGelu+:1:-1"])
    with pytest.raises(ValueError, match="save_onnx=True"):
        ORTOptions(onnx_dir="graphs")
    with pytest.raises(ValueError, match="enable_custom_autograd=True"):
        ORTOptions(mem_efficient_grad_mgmt=True, enable_custom_autograd=False)


def test_switches_map_to_ort_variables():
    env = environment_for(ORTOptions(enable_embedding_sparsity=False, memory_opt_level=2, fallback="disable"))
    assert env["ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER"] == "0"
    assert env["ORTMODULE_MEMORY_OPT_LEVEL"] == "2"
    assert env["ORTMODULE_FALLBACK_POLICY"] == "FALLBACK_DISABLE"
    assert "ORTMODULE_FALLBACK_POLICY" not in environment_for(ORTOptions())


def test_scoped_environ_restores_on_error(monkeypatch):
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "7")
    monkeypatch.delenv("ORTMODULE_USE_TRITON", raising=False)
    with pytest.raises(RuntimeError):
        with scoped_environ({"ORTMODULE_MEMORY_OPT_LEVEL": "1", "ORTMODULE_USE_TRITON": "1"}):
            assert os.environ["ORTMODULE_MEMORY_OPT_LEVEL"] == "1"
            raise RuntimeError("boom")
    assert os.environ["ORTMODULE_MEMORY_OPT_LEVEL"] == "7"
    assert "ORTMODULE_USE_TRITON" not in os.environ


def test_wrap_model_leaves_environ_unchanged():
    from ort_hf.engine.runtime import ensure_engine

    # Importing ORT once per process has side effects of its own (it imports DeepSpeed when
    # installed, which sets PYTORCH_NVML_BASED_CUDA_CHECK); this test is about each wrap.
    ensure_engine()
    before = dict(os.environ)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    opts = ORTOptions(fallback="disable", log_level="ERROR", memory_opt_level=1, enable_embedding_sparsity=False)
    wrapped = wrap_model(model, opts)
    wrapped(torch.randn(2, 4)).sum().backward()
    assert wrapped.engine_status().backend == "ort"
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    "switches",
    [
        {"enable_embedding_sparsity": False},  # crashed ORT's export as shipped
        {"enable_compute_optimizer": False},  # likewise
    ],
)
def test_switches_that_crashed_ort_now_train(switches):
    from tiny_models import FAMILIES, build, make_batch

    fam = FAMILIES["bert-mlm"]
    wrapped = wrap_model(build(fam), ORTOptions(fallback="disable", log_level="ERROR", **switches))
    wrapped.train()
    wrapped(**make_batch("mlm", torch.Generator().manual_seed(0))).loss.backward()
    assert wrapped.engine_status().backend == "ort"


@pytest.mark.parametrize("threads,spinning,expected", [(None, None, False), (1, True, True), (None, False, False)])
def test_intra_op_threads_and_spinning_reach_the_training_session(threads, spinning, expected):
    """ORT sizes its pool to the cores whatever torch uses; intra_op_threads pins it (the
    benchmark gives ORT the threads it gives PyTorch). Spinning (off by default on CPU) is read
    back from the live session."""
    from tiny_models import FAMILIES, build, make_batch

    wrapped = wrap_model(
        build(FAMILIES["bert-cls"]),
        ORTOptions(fallback="disable", log_level="ERROR", intra_op_threads=threads, intra_op_spinning=spinning),
    )
    wrapped.train()
    assert wrapped.session_threading() is None  # no session before the first step
    wrapped(**make_batch("cls", torch.Generator().manual_seed(0))).loss.backward()
    assert wrapped.engine_status().backend == "ort"
    assert wrapped.session_threading() == {"threads": threads or 0, "spinning": expected, "torch_threads": 1}


def test_an_exported_variable_the_options_set_otherwise_is_named_once(monkeypatch, caplog):
    import logging

    import torch

    from ort_hf.engine import wrap_model

    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")  # as ORT's own guide says
    monkeypatch.setenv("ORTMODULE_PRINT_MEMORY_STATS", "0")  # not one ort_hf sets: passed through
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        for _ in range(2):
            wrap_model(torch.nn.Linear(2, 2), ORTOptions(fallback="disable", memory_opt_level=0))
    said = [r.getMessage() for r in caplog.records if "overridden by ORTOptions" in r.getMessage()]
    assert len(said) == 1 and "ORTMODULE_MEMORY_OPT_LEVEL=1" in said[0] and "ORTMODULE_MEMORY_OPT_LEVEL=0" in said[0]
    assert not [m for m in said if "PRINT_MEMORY_STATS" in m]


def test_efficient_attention_registers_ort_graph_optimiser():
    import torch

    from ort_hf.engine import wrap_model

    wrap_model(torch.nn.Linear(2, 2), ORTOptions(use_efficient_attention=True))
    from onnxruntime.training.ortmodule.graph_optimizer_registry import GraphOptimizerRegistry

    registered = [fn.__name__ for entries in GraphOptimizerRegistry._OPTIMIZER_FUNCS.values() for fn, _, _ in entries]
    assert "optimize_graph_for_aten_efficient_attention" in registered
