"""ORT's export cache (--ort_export_cache_dir) shared by runs: keyed, locked, never loads a bad entry."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("cache_run.py")


def _start(cache_dir, kind="eager", options=None):
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(cache_dir), kind, json.dumps(options or {})],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["backend"] == "ort"  # fallback is disabled too: an ORT session ran
    return result


def _run(cache_dir, kind="eager", options=None) -> dict:
    return _finish(_start(cache_dir, kind, options))


def _graphs(cache_dir):
    """The exported graphs in the cache (not the processed, training and session graphs kept beside them)."""
    kept = ("processed-", "gradient-", "session-")
    return sorted(p for p in Path(cache_dir).glob("*/*.onnx") if not p.name.startswith(kept))


def _processed(cache_dir):
    return sorted(Path(cache_dir).glob("*/processed-*.onnx"))


def _training_graphs(cache_dir):
    return sorted(Path(cache_dir).glob("*/gradient-*.onnx"))


def _session_graphs(cache_dir):
    return sorted(Path(cache_dir).glob("*/session-*.onnx"))


@pytest.fixture(scope="module")
def uncached(tmp_path_factory):
    return _run("")  # "" = no cache


def test_two_runs_at_once_share_one_entry_and_a_third_reuses_it(tmp_path, uncached):
    first, second = _start(tmp_path), _start(tmp_path)
    results = [_finish(first), _finish(second)]
    assert sorted(r["export_count"] for r in results) == [0, 1]  # one exported, the other waited and reused it
    (graph,) = _graphs(tmp_path)
    assert graph.with_suffix(".complete").exists()
    third = _run(tmp_path)
    assert third["export_count"] == 0
    for result in (*results, third):
        assert result["losses"] == pytest.approx(uncached["losses"], abs=1e-6)


def test_an_entry_whose_write_never_finished_is_redone(tmp_path, uncached):
    _run(tmp_path)
    (graph,) = _graphs(tmp_path)
    graph.write_bytes(graph.read_bytes()[:1000])  # a run killed while ORT was saving
    graph.with_suffix(".complete").unlink()
    again = _run(tmp_path)
    assert again["export_count"] == 1 and again["losses"] == pytest.approx(uncached["losses"], abs=1e-6)
    assert graph.with_suffix(".complete").exists() and graph.stat().st_size > 1000


def test_a_corrupt_entry_is_replaced_with_a_warning(tmp_path, uncached):
    _run(tmp_path)
    (graph,) = _graphs(tmp_path)
    graph.write_bytes(b"not an onnx model")
    again = _run(tmp_path)
    assert again["losses"] == pytest.approx(uncached["losses"], abs=1e-6)
    assert any("does not match the hash" in w for w in again["warnings"]), again["warnings"]


def test_an_unusable_cache_dir_warns_and_trains(tmp_path, uncached):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a cache dir below a regular file can never be created (also as root)
    result = _run(blocker / "cache")
    assert result["export_count"] == 1 and result["losses"] == pytest.approx(uncached["losses"], abs=1e-6)
    assert any("cannot be used" in w and "--ort_export_cache_dir" in w for w in result["warnings"])


def test_models_with_the_same_repr_get_their_own_entries(tmp_path):
    _run(tmp_path, "eager")
    sdpa = _run(tmp_path, "sdpa")  # ORT's own key (the module repr) is the same for both
    assert sdpa["export_count"] == 1
    graphs = _graphs(tmp_path)
    assert len(graphs) == 2 and graphs[0].name == graphs[1].name  # ORT alone would have loaded the eager graph


@pytest.mark.parametrize("kind", ["python-op", "sparse-lm", "chunked-lm"])
def test_a_graph_with_python_ops_is_restored_in_a_fresh_process(tmp_path, kind):
    """A hit registers the graph's autograd Functions again and re-creates what ORT passed them by
    address (ORT's label flag "label", the fused head's missing bias): it trains as the export did,
    label sparsity included."""
    first = _run(tmp_path, kind)
    (graph,) = _graphs(tmp_path)
    assert graph.with_suffix(".functions.json").exists()
    hit = _run(tmp_path, kind)  # a fresh process
    assert first["export_count"] == 1 and hit["export_count"] == 0
    # The processed graph is kept too (a class no sweep proved also gets a pre-flight export, uncached).
    assert hit["shape_inferences"] == first["shape_inferences"] - 1
    assert hit["losses"] == first["losses"] and hit["grads"] == first["grads"]
    # The training graph and the session's optimised graph are kept too, the fused head's
    # by-address arguments copied into both on a hit.
    assert first["gradient_built"] and not hit["gradient_built"]
    assert first["session_optimised"] and not hit["session_optimised"]
    assert hit["python_ops"] == first["python_ops"] and hit["label_sparsity"] == first["label_sparsity"]
    assert first["label_sparsity"] == (kind == "sparse-lm")
    # ORT's banner says what the graph does: its hook noted the flag in the export, ort_hf on the hit.
    assert sorted(hit["label_flags_noted"]) == sorted(first["label_flags_noted"])
    assert bool(first["label_flags_noted"]) == first["label_sparsity"]


def test_a_changed_function_source_is_exported_again(tmp_path):
    from ort_hf.engine import trust

    first = _run(tmp_path, "python-op")
    (graph,) = _graphs(tmp_path)
    record = graph.with_suffix(".functions.json")
    kept = json.loads(record.read_text())
    kept["functions"] = {name: "0" * 64 for name in kept["functions"]}  # as if _Square's file had changed
    record.write_text(json.dumps(kept))
    trust.record(record)
    again = _run(tmp_path, "python-op")
    assert again["export_count"] == 1 and again["losses"] == first["losses"]
    assert json.loads(record.read_text())["functions"] != kept["functions"]  # the entry was redone


@pytest.mark.parametrize("kind", ["local-python-op", "undeclared-lm"])
def test_graphs_a_fresh_process_cannot_restore_are_not_cached(tmp_path, kind):
    """A Function defined inside a function cannot be imported by name; a label flag no module
    declared depends on the batch, not on what the key holds."""
    _run(tmp_path, kind)
    assert _graphs(tmp_path) == [] and list(tmp_path.glob("*/uncacheable"))


def test_the_key_holds_the_parameter_dtypes_and_the_autocast_in_force():
    """An fp32 graph is never reused for a run in another dtype or under autocast (ORT's export
    runs under the caller's autocast; the key is taken there)."""
    from types import SimpleNamespace

    import torch

    from ort_hf.engine.export_cache import entry_key

    info = SimpleNamespace(
        onnx_graph_input_names=["x"],
        onnx_graph_input_names_require_grad=[],
        onnx_graph_input_dynamic_axes_map={"x": {0: "batch"}},
        export_mode="training",
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))

    def key():
        return entry_key(model, info, [torch.zeros(2, 4)], {"onnx_opset_version": 17})

    fp32 = key()
    assert key() == fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_autocast = key()
    with torch.autocast("cpu", dtype=torch.float16):
        fp16_autocast = key()
    assert len({fp32, bf16_autocast, fp16_autocast}) == 3
    model.double()
    assert key() not in (fp32, bf16_autocast, fp16_autocast)
    model.float()
    model[1].num_batches_tracked.data = model[1].num_batches_tracked.data.int()  # a buffer's dtype alone
    assert key() != fp32


def test_a_hit_loads_the_kept_output_schema_and_trains_as_the_export_did(tmp_path):
    """A hit runs no PyTorch forward (the output structure is kept beside the graph) and no shape
    inference (the post-processed graph is kept too), and trains as the run that exported: the same
    losses and gradients, the same output class. A kept structure or processed graph that is not
    the file recorded is not used: ORT's pass or shape inference runs again."""
    first = _run(tmp_path)
    (graph,) = _graphs(tmp_path)
    schema = graph.with_suffix(".schema.json")
    assert schema.exists()
    hit = _run(tmp_path)
    assert first["export_count"] == 1 and first["structure_passes"] == 1
    assert hit["export_count"] == 0 and hit["structure_passes"] == 0
    assert hit["out_type"] == first["out_type"] == "SequenceClassifierOutput"
    assert hit["losses"] == first["losses"] and hit["grads"] == first["grads"]
    # the config field the export's forward set is set on a hit too (the entry's config record)
    assert hit["problem_type"] == first["problem_type"] == "single_label_classification"

    # ORT's shape inference ran once, its result (after ort_hf's repairs) kept beside the graph.
    (processed,) = _processed(tmp_path)
    assert first["shape_inferences"] == 1 and hit["shape_inferences"] == 0
    # ORT's gradient build ran once, the training graph it built kept beside them; so did the
    # session's optimisers, a hit's session loading the graph they made with them off.
    assert first["gradient_built"] and not hit["gradient_built"]
    assert first["session_optimised"] and not hit["session_optimised"]

    processed.write_bytes(processed.read_bytes()[:-1] + b"\x00")  # no longer the file recorded
    redone = _run(tmp_path)
    assert redone["export_count"] == 0 and redone["shape_inferences"] == 1
    assert redone["losses"] == first["losses"] and redone["grads"] == first["grads"]

    kept = schema.read_text()
    schema.write_text(kept.replace("logits", "scores"))  # no longer the file recorded
    tampered = _run(tmp_path)
    assert tampered["export_count"] == 0 and tampered["structure_passes"] == 1  # the graph loaded, the pass ran
    assert tampered["out_type"] == "SequenceClassifierOutput"
    assert tampered["losses"] == first["losses"] and tampered["grads"] == first["grads"]
    assert schema.read_text() == kept


def test_kept_training_and_session_graphs_serve_only_the_build_they_came_from(tmp_path):
    """Other settings of ORT's gradient build (its compute optimizer off) build again, into a file
    of their own, from the same exported graph; other session options (memory reuse) optimise
    again, into a session graph of their own; a kept graph that is not the file recorded is built
    or optimised again, and trains as the first run did."""
    first = _run(tmp_path)
    (kept,) = _training_graphs(tmp_path)
    (session,) = _session_graphs(tmp_path)
    other = _run(tmp_path, options={"enable_compute_optimizer": False})
    assert other["export_count"] == 0 and other["gradient_built"] and other["session_optimised"]
    assert len(_training_graphs(tmp_path)) == 2 and len(_session_graphs(tmp_path)) == 2
    reuse = _run(tmp_path, options={"enable_mem_reuse": True})
    assert not reuse["gradient_built"] and reuse["session_optimised"] and len(_session_graphs(tmp_path)) == 3
    for graph in (kept, session):
        graph.write_bytes(graph.read_bytes()[:-1] + b"\x00")  # no longer the file recorded
    rebuilt = _run(tmp_path)
    assert rebuilt["export_count"] == 0 and rebuilt["gradient_built"] and rebuilt["session_optimised"]
    assert rebuilt["losses"] == first["losses"] and rebuilt["grads"] == first["grads"]
