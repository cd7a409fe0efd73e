"""The session-optimised training graph in the export cache: a hit skips ORT's session-level graph
optimisers.

ORT's training session (``TrainingAgent``, an ``InferenceSession``) optimises the training graph
again when it loads it: dozens of graph transformer passes (fusions, constant folding, layout),
most of a cache hit's session creation (``docs/benchmarks.md``, "Where ORT's first step goes").
Their result is a function of the training graph, the session options and the CPU, so with the
export cache on, a CPU training session saves the graph it optimised into the cache entry
(``optimized_model_filepath``), and a later session of the same graph, options and CPU loads that
graph with ORT's optimisers off (``ORT_DISABLE_ALL``): the graph the session runs is the one it
would have made. The file is named by a digest of:

- the training graph handed to the session (after ort_hf's kernel swaps), PythonOps' by-address
  arguments left out;
- the session options that steer the optimisers (level, execution order, determinism, memory
  reuse and pattern, prepacking, the recompute probe);
- the machine: ORT fuses and lays out for the CPU it runs on (its NCHWc blocks follow the vector
  width), so the CPU's model name and instruction-set flags are in the key;
- this file. The entry's key already holds the versions.

A PythonOp's by-address arguments are copied by node name from this run's training graph into the
kept one. ORT warns, when it saves a graph optimised past its extended level, that the file suits
only the machine it was made on; the key holds the machine, so at ORT's default log level the
miss's session is created with its warnings off (a user who asked for ORT's info or verbose log
still gets them).

Only CPU sessions without ORT's memory optimiser (recompute) are kept: its plans are made when the
session optimises, and a session that loads its graph optimised would make none. Nor when ORT's
debug option saves the session's graph itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from functools import lru_cache
from pathlib import Path

from . import trust
from .python_op_cache import POINTERS, pointer_ops, take_pointers, without_pointers

logger = logging.getLogger(__name__)

# ORT's log severities (0 verbose ... 4 fatal; -1: its default logger's, warnings)
_WARNING, _ERROR = (-1, 2), 3
_CONFIG_KEYS = (  # every session config entry ORTModule 1.19.2 and ort_hf set that steers optimisation
    "session.disable_prepacking",
    "optimization.memory_optimizer_config",
    "optimization.enable_memory_probe_recompute_config",
)


@lru_cache(maxsize=1)
def _machine() -> dict:
    found = {"machine": platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags", "vendor_id") and key.strip() not in found:
                found[key.strip()] = value.strip()
    except OSError:
        found["processor"] = platform.processor()
    return found


def _config(options, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # not set
        return None


def _usable(options, providers) -> bool:
    return (
        list(providers or []) == ["CPUExecutionProvider"]
        and not options.optimized_model_filepath
        and not _config(options, "optimization.memory_optimizer_config")
    )


def _settings(options) -> dict:
    return {
        "level": str(options.graph_optimization_level),
        "execution_order": str(options.execution_order),
        "deterministic": options.use_deterministic_compute,
        "mem_reuse": options.enable_mem_reuse,
        "mem_pattern": options.enable_mem_pattern,
        "config": {key: _config(options, key) for key in _CONFIG_KEYS},
        "machine": _machine(),
    }


def _digest(graph: bytes, options) -> tuple[str, dict]:
    """The file's digest, and this run's by-address arguments by node name (to copy into it)."""
    ours: dict = {}
    if POINTERS.encode() in graph:
        import onnx

        model = onnx.load_model_from_string(graph)
        ours = pointer_ops(model)
        graph = without_pointers(model)
    digest = hashlib.sha256(graph)
    digest.update(json.dumps(_settings(options), sort_keys=True).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:24], ours


def create_agent(original, bound) -> None:
    """ORT's ``TrainingAgent.__init__`` (``original``, its arguments ``bound``: an
    ``inspect.BoundArguments``), the session's optimised graph kept in and loaded from the export
    cache entry the export ran in, where there is one."""
    from .export_record import ACTIVE_EXPORT_RECORD

    record = ACTIVE_EXPORT_RECORD.get()
    entry = record.export_cache_entry if record is not None else None
    arguments = bound.arguments
    graph, options = arguments.get("path_or_bytes"), arguments.get("session_options")
    if entry is None or not isinstance(graph, bytes) or options is None:
        return original(*bound.args, **bound.kwargs)
    if not _usable(options, arguments.get("providers")):
        return original(*bound.args, **bound.kwargs)
    name, ours = _digest(graph, options)
    path = Path(entry) / f"session-{name}.onnx"
    kept = _load(path, ours)
    if kept is not None:
        import onnxruntime

        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        arguments["path_or_bytes"] = kept
        return original(*bound.args, **bound.kwargs)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    level = options.log_severity_level
    options.optimized_model_filepath = str(tmp)
    if level in _WARNING:
        options.log_severity_level = _ERROR
    try:
        original(*bound.args, **bound.kwargs)
    except Exception as exc:  # ORT fails the session when it cannot save (a full or read-only disk)
        logger.info("ort_hf: the session graph could not be saved in %s (%s); creating it unsaved", path.parent, exc)
        options.optimized_model_filepath, options.log_severity_level = "", level
        return original(*bound.args, **bound.kwargs)
    else:
        _store(path, tmp)
    finally:
        tmp.unlink(missing_ok=True)
    return None


def _load(path: Path, ours: dict) -> bytes | None:
    """The kept graph with this run's by-address arguments, or None (absent, not the file recorded,
    unreadable, or a kept PythonOp with by-address arguments that this run's graph lacks)."""
    if not (path.exists() and trust.verified(path)):
        return None
    try:
        graph = path.read_bytes()
        if not ours:
            return None if POINTERS.encode() in graph else graph
        import onnx

        model = onnx.load_model_from_string(graph)
        return model.SerializeToString() if take_pointers(model, ours) else None
    except Exception as exc:  # a protobuf DecodeError, an OSError: optimised again
        logger.info("ort_hf: not using the session graph %s (%s)", path, exc)
        return None


def _store(path: Path, tmp: Path) -> None:
    """Move the graph ORT saved into the entry (atomically, recorded under the entry's lock); a
    failure only costs the next run the optimisers."""
    import filelock

    try:
        with filelock.FileLock(str(path.parent / ".lock")):
            os.replace(tmp, path)
            trust.record(path)
    except OSError as exc:
        logger.info("ort_hf: the session graph was not kept in %s (%s)", path.parent, exc)
