"""`make test-gpu`'s report (scripts/gpu_report.py) picks ORT's own error out of a failure."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_report.py"
_spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
gpu_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_report)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.engine.test_gpu" name="test_ok" time="1.0"/>
<testcase classname="tests.engine.test_gpu" name="test_bf16" time="2.0">
<failure message="RuntimeError: ORT failed at step 1">Traceback (most recent call last):
  File "x.py", line 1, in f
onnxruntime.capi.onnxruntime_pybind11_state.Fail: [ONNXRuntimeError] : 1 : FAIL : Could not find an implementation for GeluGrad(1) node with name 'x'
</failure></testcase>
<testcase classname="tests.engine.test_gpu" name="test_cpu" time="0.0"><skipped message="no CUDA device on this machine"/></testcase>
</testsuite></testsuites>"""


def test_report_names_each_test_and_the_first_ort_error(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    rows = gpu_report.test_results(junit)
    assert rows[0] == ("tests.engine.test_gpu::test_ok", "passed", "")
    assert rows[1][1] == "FAILED"
    assert "[ONNXRuntimeError] : 1 : FAIL : Could not find an implementation for GeluGrad(1)" in rows[1][2]
    assert rows[2] == ("tests.engine.test_gpu::test_cpu", "skipped", "no CUDA device on this machine")
    text = gpu_report.render("ort-hf doctor\n  result: the engine can train", rows, "1 failed, 1 passed")
    assert "1 passed, 1 failed, 0 error, 1 skipped" in text and "## ort-hf doctor" in text


def test_report_lists_the_memcpy_nodes_each_test_recorded(tmp_path):
    """A CUDA test records the Memcpy nodes of its saved execution graph (parity.record_memcpy_nodes,
    written by pytest's record_property) instead of failing on them; the report lists them per test."""
    import json
    from xml.sax.saxutils import quoteattr

    from onnx import TensorProto, helper, save
    from parity import MEMCPY_PROPERTY, record_memcpy_nodes

    graph = helper.make_graph(
        [helper.make_node("MemcpyToHost", ["x"], ["y"], name="Memcpy_token_7"), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])],
    )
    save(helper.make_model(graph), str(tmp_path / "bert_execution_model_training.onnx"))
    properties = []
    found = record_memcpy_nodes(tmp_path, lambda name, value: properties.append((name, value)))
    assert found == ["bert_execution_model_training.onnx: MemcpyToHost Memcpy_token_7 (x)"]
    assert properties == [(MEMCPY_PROPERTY, json.dumps(found))]

    def case(name, recorded):  # a testcase as pytest's JUnit XML writes one with its properties
        props = "".join(f"<property name={quoteattr(k)} value={quoteattr(v)}/>" for k, v in recorded)
        return (
            f'<testcase classname="tests.engine.test_gpu" name="{name}" time="1.0">'
            f"<properties>{props}</properties></testcase>"
        )

    (tmp_path / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        + case("test_fp16", [*properties, (MEMCPY_PROPERTY, "[]")])  # two runs in one test: one list
        + case("test_parity", [(MEMCPY_PROPERTY, "[]")])
        + "</testsuite></testsuites>"
    )
    junit = tmp_path / "junit.xml"
    records = gpu_report.recorded(junit)
    assert records == {
        "tests.engine.test_gpu::test_fp16": {MEMCPY_PROPERTY: found},
        "tests.engine.test_gpu::test_parity": {MEMCPY_PROPERTY: []},
    }
    text = gpu_report.render("ort-hf doctor", gpu_report.test_results(junit), "2 passed", records)
    assert f"| `tests.engine.test_gpu::test_fp16` | passed |  | {MEMCPY_PROPERTY}: 1 |" in text
    assert f"| `tests.engine.test_gpu::test_parity` | passed |  | {MEMCPY_PROPERTY}: 0 |" in text
    listed = text.split("## Recorded by the tests")[1]
    assert "test_fp16" in listed and found[0] in listed and "test_parity" not in listed
