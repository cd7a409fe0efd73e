"""What session_graph_cache decides around ORT's TrainingAgent, with ORT's session stood in for: which
sessions it keeps, what the key holds, and that a save ORT cannot make never fails the session.
(Real sessions, hits and bit-identical training: tests/reliability/test_export_cache.py.)"""

import inspect

import onnxruntime
import pytest

from ort_hf.engine import session_graph_cache
from ort_hf.engine.export_record import ACTIVE_EXPORT_RECORD, ExportRecord

CPU = ["CPUExecutionProvider"]


class FakeAgent:
    """Records what each __init__ call saw; ``fail_saving`` makes a call that must save raise, as
    ORT's session does when it cannot write ``optimized_model_filepath``."""

    def __init__(self, fail_saving=False):
        self.calls, self.fail_saving = [], fail_saving

    def init(self, agent, path_or_bytes, fw_feed_names, session_options=None, providers=None):
        saving = session_options.optimized_model_filepath
        self.calls.append((path_or_bytes, saving, session_options.log_severity_level))
        if saving and self.fail_saving:
            raise RuntimeError("SystemError : 2")
        if saving:
            with open(saving, "wb") as f:
                f.write(b"optimised " + path_or_bytes)


def _create(fake, tmp_path, options, providers=CPU, graph=b"graph"):
    bound = inspect.signature(fake.init).bind(object(), graph, ["x"], options, providers)
    token = ACTIVE_EXPORT_RECORD.set(ExportRecord(export_cache_entry=tmp_path))
    try:
        session_graph_cache.create_agent(lambda *a, **k: fake.init(*a, **k), bound)
    finally:
        ACTIVE_EXPORT_RECORD.reset(token)


def test_a_session_graph_is_saved_then_loaded_with_the_optimisers_off(tmp_path):
    fake = FakeAgent()
    _create(fake, tmp_path, onnxruntime.SessionOptions())
    (kept,) = tmp_path.glob("session-*.onnx")
    assert fake.calls[0][1] and fake.calls[0][2] == 3  # saved, ORT's machine-specific warning off
    options = onnxruntime.SessionOptions()
    _create(fake, tmp_path, options)
    assert fake.calls[1][:2] == (kept.read_bytes(), "")
    assert options.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL


def test_a_save_orts_session_cannot_make_creates_the_session_unsaved(tmp_path):
    fake = FakeAgent(fail_saving=True)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 2
    _create(fake, tmp_path, options)
    assert [call[1] != "" for call in fake.calls] == [True, False]
    assert fake.calls[1] == (b"graph", "", 2)  # the user's log level back, nothing kept
    assert not list(tmp_path.glob("*session-*"))


@pytest.mark.parametrize("case", ["cuda", "recompute", "debug save"])
def test_sessions_it_cannot_prove_are_left_to_ort(tmp_path, case):
    options = onnxruntime.SessionOptions()
    providers = CPU
    if case == "cuda":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    elif case == "recompute":
        options.add_session_config_entry("optimization.memory_optimizer_config", "/tmp/plan.json")
    else:
        options.optimized_model_filepath = str(tmp_path / "mine.onnx")
    fake = FakeAgent()
    _create(fake, tmp_path, options, providers)
    assert len(fake.calls) == 1 and not list(tmp_path.glob("session-*"))
    assert options.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_the_key_holds_the_cpu_and_the_options_that_steer_the_optimisers(monkeypatch):
    def key(**changes):
        options = onnxruntime.SessionOptions()
        for name, value in changes.items():
            setattr(options, name, value)
        return session_graph_cache._digest(b"graph", options)[0]

    plain = key()
    assert key(enable_mem_reuse=False) != plain
    assert key(execution_order=onnxruntime.ExecutionOrder.PRIORITY_BASED) != plain
    assert key(intra_op_num_threads=7) == plain  # threads do not change the graph
    monkeypatch.setattr(session_graph_cache, "_machine", lambda: {"flags": "avx2"})
    assert key() != plain
