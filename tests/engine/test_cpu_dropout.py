"""engine/cpu_kernel_swaps.py with csrc/cpu_dropout.cpp: ORT's Dropout / DropoutGrad pair, swapped
for ort_hf's kernels, run in ORT sessions: the same contract (kept with probability 1 - ratio,
scaled by 1 / (1 - ratio), the gradient through the same mask), masks reproducible from a seed
and independent of the thread count, fresh masks for every call; what it cannot translate stays."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from ort_hf.engine.cpu_kernel_swaps import swap_kernels

N = 200_003  # odd: the kernel draws one 64-bit value per pair of elements
RATIO = 0.1


pytestmark = pytest.mark.usefixtures("aten_nodes_run")


def _model(ratio=RATIO, training=True, ratio_as_input=False, mask_reader="DropoutGrad", dtype=TensorProto.FLOAT):
    inputs = [helper.make_tensor_value_info("x", dtype, [N]), helper.make_tensor_value_info("dy", dtype, [N])]
    inits = [helper.make_tensor("training", TensorProto.BOOL, [], [training])]
    if ratio_as_input:
        inputs.append(helper.make_tensor_value_info("ratio", TensorProto.FLOAT, []))
    else:
        inits.append(helper.make_tensor("ratio", TensorProto.FLOAT, [], [ratio]))
    nodes = [
        helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], name="drop"),
        helper.make_node("Dropout", ["x", "ratio", "training"], ["y2", "mask2"], name="drop2"),
    ]
    if mask_reader == "DropoutGrad":
        nodes += [
            helper.make_node("DropoutGrad", ["dy", "mask", "ratio", "training"], ["dx"], domain="com.microsoft"),
            helper.make_node("DropoutGrad", ["dy", "mask2", "ratio", "training"], ["dx2"], domain="com.microsoft"),
        ]
    else:  # the mask read by something else: the pair must stay ORT's
        nodes += [
            helper.make_node("Cast", ["mask"], ["dx"], to=dtype),
            helper.make_node("Cast", ["mask2"], ["dx2"], to=dtype),
        ]
    outputs = [helper.make_tensor_value_info(name, dtype, [N]) for name in ("y", "dx", "y2", "dx2")]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        outputs,
        inits,
        value_info=[helper.make_tensor_value_info(name, TensorProto.BOOL, [N]) for name in ("mask", "mask2")],
    )
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 16),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid("org.pytorch.aten", 1),
        ],
        ir_version=8,
    )


def _session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _feeds():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, N).astype(np.float32)  # no zeros: y == 0 marks a dropped element
    return {"x": x, "dy": rng.standard_normal(N).astype(np.float32)}


def test_swapped_pair_keeps_ort_dropouts_contract():
    model = _model()
    assert swap_kernels(model.graph) == {"Dropout": 2, "DropoutGrad": 2}
    assert {(n.op_type, n.domain) for n in model.graph.node} == {("ATen", "org.pytorch.aten"), ("Constant", "")}
    session, feeds = _session(model), _feeds()
    torch.ops.ort_hf.set_dropout_seed(7)
    y, dx, y2, dx2 = session.run(None, feeds)
    kept = y != 0
    assert abs(kept.mean() - (1 - RATIO)) < 0.005  # 7 standard deviations at this N
    np.testing.assert_allclose(y, np.where(kept, feeds["x"] / (1 - RATIO), 0), rtol=1e-6)
    np.testing.assert_allclose(dx, np.where(kept, feeds["dy"] / (1 - RATIO), 0), rtol=1e-6)
    np.testing.assert_allclose(dx2, np.where(y2 != 0, feeds["dy"] / (1 - RATIO), 0), rtol=1e-6)
    assert 0.8 < (kept == (y2 != 0)).mean() < 0.84  # two calls draw independent masks (0.9^2 + 0.1^2 = 0.82)


def test_masks_follow_the_seed_not_the_threads():
    model = _model()
    swap_kernels(model.graph)
    session, feeds = _session(model), _feeds()
    threads = torch.get_num_threads()
    masks = {}
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            torch.ops.ort_hf.set_dropout_seed(11)
            masks[n_threads] = session.run(None, feeds)[0] != 0
            masks[n_threads, "next"] = session.run(None, feeds)[0] != 0  # same seed, later calls
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(masks[1], masks[2])
    np.testing.assert_array_equal(masks[1, "next"], masks[2, "next"])
    assert not np.array_equal(masks[1], masks[1, "next"])  # a fresh mask every call
    torch.ops.ort_hf.set_dropout_seed(12)
    assert not np.array_equal(session.run(None, feeds)[0] != 0, masks[1])


@pytest.mark.parametrize(
    "change",
    [
        dict(ratio_as_input=True),
        dict(training=False),
        dict(ratio=0.0),
        dict(mask_reader="Cast"),
        dict(dtype=TensorProto.DOUBLE),
    ],
    ids=["ratio-not-constant", "inference-mode", "ratio-zero", "mask-read-elsewhere", "float64"],
)
def test_what_it_cannot_translate_stays_with_ort(change):
    model = _model(**change)
    assert swap_kernels(model.graph) == {}
    assert [n.op_type for n in model.graph.node].count("Dropout") == 2


@pytest.mark.parametrize(
    "options, wanted",
    [
        (dict(), True),
        (dict(cpu_dropout_kernels=False), False),
        (dict(memory_opt_level=1), False),
        (dict(memory_opt_plans=["BiasGelu+:1:-1"]), False),
    ],
)
def test_recompute_keeps_orts_dropout_which_it_can_redraw(options, wanted):
    from ort_hf.engine.export_record import ExportRecord
    from ort_hf.engine.options import ORTOptions

    record = ExportRecord()
    record.configure(ORTOptions(**options), "cpu")
    assert ("dropout" in record.kernel_swaps) is wanted
