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
