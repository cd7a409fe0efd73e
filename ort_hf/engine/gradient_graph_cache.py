"""The built training graph in the export cache: a hit skips ORT's gradient graph build.

After the post-processed graph (``processed_cache``), ORT 1.19.2 builds the training graph in C++
(``OrtModuleGraphBuilder.build``: pre-gradient graph transformers, the gradient graph, the
forward/backward split), one of the largest parts of what a cache hit's first step had left
(``docs/benchmarks.md``, "Where ORT's first step goes"). The result (the training graph and the ``GraphInfo`` beside it) is a
function of the graph the builder starts from and of the builder's settings, so with the export
cache on it is kept in the cache entry, named by a digest of both:

- the post-processed graph (after ort_hf's repairs and any padding rewrite), by-address arguments
  of PythonOps left out;
- what ``GraphExecutionManager._initialize_graph_builder`` gives the builder (the input names,
  those trained, those needing a gradient, gradient-accumulation caching, memory-efficient
  gradient), read from the same fields it reads;
- every field of the graph transformer configuration ``_build_graph`` receives (recompute, compute
  optimizer, cast propagation), and the input shapes where ORT builds for static shapes;
- ORT's environment variables, and this file. The entry's key already holds the versions.

A hit hands ORT a stand-in builder that returns the kept graph and a ``GraphInfo`` with the kept
fields; what ORT does after the build (its registered graph optimisers, ort_hf's kernel swaps among
them, the session) runs as on a miss. A PythonOp's by-address arguments are copied from this run's
post-processed graph into the kept one, by node name (the builder keeps the names; it drops some
PythonOps, such as ORT's label-density flags, which then need none).

Only training graphs on the plain path are kept: not with ZeRO stage 3 or memory-efficient gradient
management (which feed the builder from the module's parameters), nor when ORT's debug option saves
the pre-gradient graph (a file the build writes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

from . import trust
from .python_op_cache import pointer_ops, take_pointers, without_pointers

logger = logging.getLogger(__name__)

# GraphInfo's fields (ORT 1.19.2's pybind GraphInfo), all lists or string maps.
_GRAPH_INFO_FIELDS = (
    "cached_node_arg_names",
    "frontier_node_arg_map",
    "initializer_grad_names_to_train",
    "initializer_names",
    "initializer_names_to_train",
    "module_output_gradient_name",
    "module_output_indices_requires_save_for_backward",
    "output_grad_indices_non_differentiable",
    "output_grad_indices_require_full_shape",
    "user_input_grad_names",
    "user_input_names",
    "user_output_names",
)


class _KeptBuilder:
    """Stands in for ORT's ``OrtModuleGraphBuilder`` after a hit: returns the kept training graph."""

    def __init__(self, gradient_model: bytes):
        self._gradient_model = gradient_model

    def get_gradient_model(self) -> bytes:
        return self._gradient_model


def _processed_model(manager):
    return manager._graph_transition_manager._post_export_processed_model_info._post_export_processed_model


def _usable(manager, config) -> bool:
    import torch

    info = manager._graph_transition_manager._post_export_processed_model_info
    return (
        manager._export_mode == torch.onnx.TrainingMode.TRAINING
        and not manager._runtime_options.enable_zero_stage3_support
        and not info.is_mem_efficient_grad_management_enabled
        and not config.optimized_pre_grad_filepath
    )


def _settings(manager, config) -> dict:
    """What the build depends on besides the graph (``_graph_execution_manager.py`` 1.19.2,
    ``_initialize_graph_builder`` and ``_build_graph``)."""
    info = manager._graph_transition_manager._post_export_processed_model_info
    options = manager._runtime_options
    cast = config.propagate_cast_ops_config
    transformer = {name: getattr(config, name) for name in dir(config) if not name.startswith("_")}
    transformer["propagate_cast_ops_config"] = {
        "level": cast.level,
        "allow": list(cast.allow),
        "strategy": str(cast.strategy),
    }
    static_shapes = None
    if options.use_static_shape:
        static_shapes = manager._graph_transition_manager._model_info_for_export.onnx_graph_input_shapes
    return {
        "initializer_names": list(info.onnx_graph_input_names),
        "initializer_names_to_train": list(info.onnx_graph_input_names_require_grad),
        "input_names_require_grad": list(info.onnx_graph_input_names_require_grad_user_defined),
        "enable_caching": options.enable_grad_acc_optimization,
        "use_memory_efficient_gradient": options.use_memory_efficient_gradient,
        "transformer_config": transformer,
        "static_shapes": static_shapes,
        "environment": {k: v for k, v in os.environ.items() if k.startswith(("ORTMODULE_", "ORT_"))},
    }


def _digest(processed, settings: dict) -> str:
    digest = hashlib.sha256(without_pointers(processed))
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:24]


def build_graph(original, manager, config) -> None:
    """ORT's ``GraphExecutionManager._build_graph`` (``original``), its result kept in and loaded
    from the export cache entry the export ran in (``record.export_cache_entry``), where there is one."""
    from .export_record import ACTIVE_EXPORT_RECORD

    record = ACTIVE_EXPORT_RECORD.get()
    entry = record.export_cache_entry if record is not None else None
    if entry is None or not _usable(manager, config):
        return original(manager, config)
    processed = _processed_model(manager)
    stem = Path(entry) / f"gradient-{_digest(processed, _settings(manager, config))}"
    kept = _load(stem, processed)
    if kept is not None:
        manager._graph_builder, manager._graph_info = kept
        return None
    original(manager, config)
    _store(stem, manager._graph_builder.get_gradient_model(), manager._graph_info)
    return None


def _load(stem: Path, processed):
    """(stand-in builder, GraphInfo) from the kept files, or None (absent, not the files recorded,
    unreadable, or a kept PythonOp with by-address arguments that this run's graph lacks)."""
    import onnx

    graph, info = stem.with_suffix(".onnx"), stem.with_suffix(".json")
    if not (graph.exists() and info.exists() and trust.verified(graph) and trust.verified(info)):
        return None
    try:
        gradient_model = graph.read_bytes()
        fields = json.loads(info.read_text())
        ours = pointer_ops(processed)
        if ours:
            model = onnx.load_model_from_string(gradient_model)
            if not take_pointers(model, ours):
                return None
            gradient_model = model.SerializeToString()
    except Exception as exc:  # a protobuf DecodeError, an OSError, bad JSON: built again
        logger.info("ort_hf: not using the training graph %s (%s)", graph, exc)
        return None
    if set(fields) != set(_GRAPH_INFO_FIELDS):
        return None
    return _KeptBuilder(gradient_model), SimpleNamespace(**fields)


def _store(stem: Path, gradient_model: bytes, graph_info) -> None:
    """Write the training graph and its GraphInfo into the entry (atomically, recorded under the
    entry's lock); a failure only costs the next run the build."""
    import filelock

    fields = {name: getattr(graph_info, name) for name in _GRAPH_INFO_FIELDS}
    files = {stem.with_suffix(".json"): json.dumps(fields).encode(), stem.with_suffix(".onnx"): gradient_model}
    temporary = {path: path.with_name(f".{path.name}.{os.getpid()}.tmp") for path in files}
    try:
        for path, data in files.items():
            temporary[path].write_bytes(data)
        with filelock.FileLock(str(stem.parent / ".lock")):
            for path in files:
                os.replace(temporary[path], path)
                trust.record(path)
    except OSError as exc:
        for tmp in temporary.values():
            tmp.unlink(missing_ok=True)
        logger.info("ort_hf: the training graph was not kept in %s (%s)", stem.parent, exc)
