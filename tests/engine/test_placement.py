"""engine/placement.py with wrap.py: ort_hf's CPU kernels and padding rewrites enter a training graph
only where the model's parameters are on the CPU when it is built, decided from the parameters at
every step (not from the device ORT saw at construction); a model that moved or was cast after it
was wrapped gets a new session chosen for where it is. No GPU here: the CUDA decision is forced by
faking the device type the engine reads, while ORT itself runs on the CPU."""

import logging

import pytest
import torch
from parity import UNCHECKED
from tiny_models import FAMILIES, build, make_batch

from ort_hf.engine import ORTOptions, placement, wrap_model
from ort_hf.engine.swap_switches import CORRECTIONS, SWITCHES, cpu_default, wanted_swaps
from ort_hf.module_with_loss import ModuleWithLoss


def _fake_device(monkeypatch, device: str) -> None:
    monkeypatch.setattr(placement, "model_device_type", lambda module: device)
    monkeypatch.setattr(placement, "step_device_type", lambda module, args, kwargs: device)


def _wrapped(options=UNCHECKED):
    # Dropout on and the loss in the graph: every speed swap has a node to take.
    model = ModuleWithLoss(build(FAMILIES["bert-mlm"], dropout=0.1))
    wrapped = wrap_model(model, options)
    wrapped.train()
    return wrapped


def _step(wrapped) -> float:
    batch = make_batch("mlm", torch.Generator().manual_seed(0))
    loss = wrapped(**batch)["loss"]
    loss.backward()
    assert wrapped.engine_status().backend == "ort"
    return loss.item()


def _own_nodes(wrapped) -> list[str]:
    return [n.name for n in wrapped.training_graph().graph.node if "/ort_hf_" in n.name]  # ort_hf's kernels


def test_cpu_graph_gets_every_swap_a_cuda_decision_none(monkeypatch, caplog):
    cpu = _wrapped()
    _step(cpu)
    assert set(cpu._record.swapped) >= {
        "Dropout",
        "DropoutGrad",
        "ATen",
        "SoftmaxCrossEntropyLossInternal",
        "BiasGeluGrad_dX",
        "Gemm",
    }
    assert _own_nodes(cpu)

    _fake_device(monkeypatch, "cuda")
    with caplog.at_level(logging.INFO, logger="ort_hf.engine.wrap"):
        cuda = _wrapped()
        _step(cuda)
    assert cuda._record.swapped == {} and not _own_nodes(cuda)
    assert not cuda._settings.trim_padding and not cuda._settings.eliminate_padding
    assert cuda._record.torch_threads is None  # CPU's one in-graph thread is not for CUDA graphs
    assert "trains on cuda" in caplog.text and "ort_hf's kernels off" in caplog.text


@pytest.mark.parametrize("how", ["to", "forward"])
def test_a_model_moved_after_its_first_step_gets_a_graph_for_where_it_is(monkeypatch, how):
    wrapped = _wrapped()
    _step(wrapped)
    first_session = wrapped._ort
    assert _own_nodes(wrapped) and wrapped._record.export_count == 1
    _fake_device(monkeypatch, "cuda")
    if how == "to":
        wrapped.to("cpu")  # what .cuda() / DeepSpeed's move go through: nn.Module._apply
        assert wrapped._ort is not first_session
    _step(wrapped)
    assert wrapped._ort is not first_session and wrapped._record.export_count == 2
    assert wrapped._record.swapped == {} and not _own_nodes(wrapped)


def test_a_move_that_changes_nothing_keeps_the_session():
    wrapped = _wrapped()
    _step(wrapped)
    session = wrapped._ort
    wrapped.to("cpu").float()
    _step(wrapped)
    assert wrapped._ort is session and wrapped._record.export_count == 1


def test_a_cast_after_wrapping_rebuilds_before_the_first_step():
    wrapped = _wrapped()
    session = wrapped._ort
    wrapped.double()  # DeepSpeed casts the module it was given this way (.half() / .bfloat16())
    assert wrapped._ort is not session


class _Placed(torch.nn.Module):
    """Stands for a model whose tensors are on the given devices (no second device here)."""

    def __init__(self, *devices):
        super().__init__()
        self.devices = [torch.device(d) for d in devices]

    def parameters(self, recurse=True):
        return iter([type("P", (), {"device": d})() for d in self.devices])


@pytest.mark.parametrize(
    "devices, expected",
    [
        (("cpu", "cpu"), "cpu"),
        (("cuda:0", "cuda:1"), "cuda"),
        (("cuda:0", "meta"), "cuda"),
        ((), "cpu"),
        (("cuda:0", "cpu"), "parameters on cpu and cuda"),
        (("xpu",), "trains on cpu or cuda only"),
    ],
)
def test_where_a_model_trains_is_read_from_all_its_tensors(devices, expected):
    from ort_hf.engine.placement import model_device_type

    if expected in ("cpu", "cuda"):
        assert model_device_type(_Placed(*devices)) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            model_device_type(_Placed(*devices))


@pytest.mark.parametrize("swap", sorted(SWITCHES))
def test_each_speed_swap_has_a_switch(swap):
    from ort_hf.trainer import ORTTrainingArguments

    option = SWITCHES[swap]
    assert swap in wanted_swaps(ORTOptions(**{option: True}), "cpu")
    default = getattr(ORTOptions(), option)
    if default is None:  # decided by the CPU (test_cpu_linear_products.py, test_cpu_weight_grad.py cover each kind)
        default = cpu_default(option)
    assert (swap in wanted_swaps(ORTOptions(), "cpu")) == default
    assert swap not in wanted_swaps(ORTOptions(**{option: False}), "cpu")
    assert wanted_swaps(ORTOptions(**{option: False}), "cpu") >= CORRECTIONS
    assert wanted_swaps(ORTOptions(**{option: True}), "cuda") == frozenset()
    for value in (False, True):
        args = ORTTrainingArguments(output_dir="unused", report_to=[], **{f"ort_{option}": value})
        assert getattr(args.ort_options(), option) is value


def test_switched_off_swaps_stay_out_of_a_real_graph_and_the_log_says_so(caplog):
    off = {option: False for option in SWITCHES.values()}
    with caplog.at_level(logging.INFO, logger="ort_hf.engine.wrap"):
        wrapped = _wrapped(ORTOptions(fallback="disable", log_level="ERROR", preflight="never", **off))
        loss = _step(wrapped)
    assert not _own_nodes(wrapped)
    assert set(wrapped._record.swapped) == {"Gemm"}  # the corrections have no switch
    assert "ort_hf's CPU kernels on: none" in caplog.text
    assert all(f"--ort_{option} false" in caplog.text for option in SWITCHES.values())
    assert torch.isfinite(torch.tensor(loss))


def test_a_cast_of_the_wrapped_model_itself_is_seen_at_the_next_step():
    wrapped = _wrapped()
    session = wrapped._ort
    wrapped.module.double()  # past the wrapper's .to(): only the step's own check can see it
    assert wrapped._ort is session
    assert not wrapped._placed_as_built((), {})
    wrapped.module.float()
    assert wrapped._placed_as_built((), {})
