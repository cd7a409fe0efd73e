"""The post-processed graph in the export cache: a hit skips ORT's symbolic shape inference too.

After the export, ORT 1.19.2's ``_post_export_process`` copies the graph, gives each PythonOp its
context output and runs its Python symbolic shape inference over every node (0.4 to 1.6 s at 23M
to 485M parameters: ``docs/benchmarks.md``); ort_hf's graph repairs (``graph_repairs``) follow.
That is a function of the exported graph and the code doing it, so with the export cache on, the
result is kept in the cache entry, named by a digest of the exported graph, the settings it
depends on and the code: ORT, onnx, and ort_hf's repairs (the entry's key already holds the
versions and ``compat``, which patches the shape inference). A later run exporting the same graph
(a hit, or the same export again) loads it and runs ORT's post-processing without the shape
inference; what ORT derives beside the graph (input names, gradients wanted) it still derives.

Addresses differ between processes: a PythonOp's by-address arguments (``python_op_cache``) are
left out of the digest and copied from this run's exported graph into the loaded one.

Only the plain path is kept: not with ZeRO stage 3 or memory-efficient gradient management
(which rewrite the graph again from the module's parameters), nor without shape inference.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from . import trust
from .python_op_cache import POINTERS, attributes, without_pointers

logger = logging.getLogger(__name__)


def _python_ops(model) -> list:
    return [node for node in model.graph.node if node.op_type == "PythonOp"]


def _digest(model, kwargs: dict) -> str:
    """The exported graph (by-address arguments left out), the settings and the code."""
    from . import graph_repairs

    digest = hashlib.sha256(without_pointers(model))
    settings = {k: str(kwargs.get(k)) for k in ("export_mode", "enable_custom_autograd_function")}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for source in (graph_repairs.__file__, __file__):
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:24]


def _usable(kwargs: dict) -> bool:
    return (
        kwargs.get("run_symbolic_shape_infer") is True
        and not kwargs.get("enable_zero_stage3_support")
        and not kwargs.get("enable_mem_efficient_grad_management")
    )


def post_process(original, kwargs: dict, repair):
    """ORT's ``_post_export_process`` (``original``) followed by ``repair(model)`` (ort_hf's graph
    repairs, in place), the processed graph kept in and loaded from the export cache entry the
    export ran in (``record.export_cache_entry``), where there is one."""
    from .export_record import ACTIVE_EXPORT_RECORD

    record = ACTIVE_EXPORT_RECORD.get()
    entry = record.export_cache_entry if record is not None else None
    if entry is None or not _usable(kwargs):
        info = original(**kwargs)
        repair(info._post_export_processed_model)
        return info
    exported = kwargs["exported_model_info"].exported_model
    path = Path(entry) / f"processed-{_digest(exported, kwargs)}.onnx"
    loaded = _load(path, exported)
    if loaded is not None:
        info = original(**{**kwargs, "run_symbolic_shape_infer": False})
        info._post_export_processed_model = loaded
        return info
    info = original(**kwargs)
    repair(info._post_export_processed_model)
    _store(path, info._post_export_processed_model)
    return info


def _load(path: Path, exported):
    """The kept graph with this run's by-address arguments, or None (absent, not the file
    recorded, unreadable, or its PythonOps not the exported graph's)."""
    import onnx

    if not (path.exists() and trust.verified(path)):
        return None
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # a protobuf DecodeError, an OSError: processed again
        logger.info("ort_hf: not using the processed graph %s (%s)", path, exc)
        return None
    ours, kept = _python_ops(exported), _python_ops(model)
    if len(ours) != len(kept):
        return None
    for source, target in zip(ours, kept):
        pointers = attributes(source).get(POINTERS)
        if pointers is None:
            continue
        attribute = attributes(target).get(POINTERS)
        if attribute is None or len(attribute.ints) != len(pointers.ints):
            return None
        attribute.ints[:] = pointers.ints
    return model


def _store(path: Path, model) -> None:
    """Write the processed graph into the entry (atomically, recorded under the entry's lock); a
    failure only costs the next run the shape inference."""
    import filelock
    import onnx

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        onnx.save(model, str(tmp))
        with filelock.FileLock(str(path.parent / ".lock")):
            os.replace(tmp, path)
            trust.record(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        logger.info("ort_hf: the processed graph was not kept in %s (%s)", path.parent, exc)
