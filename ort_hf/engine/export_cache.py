"""ORT's export cache (``ORTMODULE_CACHE_DIR``, ``--ort_export_cache_dir``), made safe to share.

ORTModule 1.19.2 caches the exported graph as ``<md5(repr(module))>_<rank>.onnx`` and loads
it whenever that file exists. As shipped that is unsafe in five ways, each handled here:

1. The key is the module's ``repr`` only: an eager and an SDPA BERT, two transformers
   versions, a changed forward, or other inputs (labels or not) share one file, and the wrong
   graph is loaded silently. Entries live in a sub-folder keyed by a digest of the versions,
   the HF config, the source of every module class, the dtypes of the parameters and buffers,
   the autocast in force (cpu and cuda), the input names/dtypes/dynamic axes and the export
   settings.
2. Two runs exporting at once race on the file; a run killed mid-write leaves a truncated
   file that every later run loads and crashes on. Exports run under a file lock per entry,
   and a file without its ``.complete`` marker (written after ORT's save returns) is deleted.
3. A cached graph with ``PythonOp`` nodes (custom autograd Functions) needs the functions
   registered during export and the objects ORT passed to them by address, which a cache hit in
   a fresh process lacks. ``python_op_cache`` records both beside the graph and restores them on
   a hit; a graph whose Functions or arguments cannot be restored that way is not cached (an
   ``uncacheable`` marker records it).
4. A read-only, misplaced or full cache folder is not fatal: the export runs uncached with
   one warning naming the folder.
5. A cache folder others can write, or a graph that is not the one exported, is never loaded
   (``trust``): the folder is replaced by a private one, the graph re-exported.

On a hit ORT still runs its output-structure pass (a whole PyTorch forward) to learn the outputs'
structure; the entry keeps that structure beside the graph (``output_schema``), and a hit whose
kept structure checks out loads both and runs no forward. The config fields the export's forward
set are kept too (``_store_config``) and set on such a hit.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import warnings
from pathlib import Path

from . import python_op_cache, trust
from .export_record import ACTIVE_EXPORT_RECORD

logger = logging.getLogger(__name__)
_warned: set[str] = set()
_UNCACHEABLE = "uncacheable"


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def versions() -> dict:
    from importlib import metadata

    found = {}
    for name in ("torch", "onnxruntime-training-cpu", "onnxruntime-training", "onnx", "transformers", "ort-hf"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def source_digest(module) -> str:
    """Digest of the source files of every module class in the tree, and of our symbolics."""
    from . import compat, symbolics

    files = {inspect.getsourcefile(compat), *(str(p) for p in Path(symbolics.__file__).parent.glob("*.py"))}
    for sub in module.modules():
        try:
            files.add(inspect.getsourcefile(type(sub)))
        except (TypeError, OSError):
            continue
    digest = hashlib.sha256()
    for name in sorted(f for f in files if f):
        digest.update(name.encode())
        digest.update(Path(name).read_bytes())
    return digest.hexdigest()


def hf_config_of(module):
    """The Hugging Face config of the first submodule that has one, or None."""
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            return config
    return None


def config_fields(module) -> dict:
    """The fields of ``module``'s HF config that JSON keeps as they are (a forward may set some:
    transformers' classifiers set ``problem_type`` on their first)."""
    config = hf_config_of(module)
    if config is None:
        return {}
    kept = (str, int, float, bool, type(None))
    return {k: v for k, v in vars(config).items() if not k.startswith("_") and isinstance(v, kept)}


def config_changes(before: dict, module) -> dict:
    """The config fields of ``module`` that differ from ``before`` (:func:`config_fields`)."""
    return {k: v for k, v in config_fields(module).items() if k not in before or before[k] != v}


def set_config_fields(module, changes: dict) -> None:
    config = hf_config_of(module)
    for name, value in changes.items():
        setattr(config, name, value)


def config_json(module) -> str | None:
    config = hf_config_of(module)
    if config is None:
        return None
    return config.to_json_string(use_diff=False) + str(getattr(config, "_attn_implementation", None))


def precision_facts(module) -> dict:
    """The dtypes of the module's parameters and buffers, and the autocast in force (the export runs
    under the caller's): an fp32 graph is never reused for an fp16, bf16 or autocast run."""
    import torch

    return {
        "parameters": sorted({str(p.dtype) for p in module.parameters()}),
        "buffers": sorted({str(b.dtype) for b in module.buffers()}),
        "autocast": {
            device: str(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else None
            for device in ("cpu", "cuda")
        },
    }


def entry_key(flattened_module, model_info, inputs, settings: dict) -> str:
    """Everything that decides the exported graph, as one digest."""
    tensors = [
        [str(getattr(t, "dtype", type(t).__name__)), getattr(t, "ndim", None), getattr(t, "requires_grad", None)]
        for t in inputs
    ]
    described = {
        "versions": versions(),
        "module": repr(flattened_module),
        "config": config_json(flattened_module),
        "source": source_digest(flattened_module),
        "precision": precision_facts(flattened_module),
        "inputs": tensors,
        "input_names": list(model_info.onnx_graph_input_names),
        "require_grad": list(model_info.onnx_graph_input_names_require_grad),
        "dynamic_axes": {
            k: {str(a): n for a, n in v.items()} for k, v in model_info.onnx_graph_input_dynamic_axes_map.items()
        },
        "export_mode": str(getattr(model_info, "export_mode", None)),
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:20]


def ort_file_name(flattened_module) -> str:
    from onnxruntime.training.ortmodule._utils import get_rank

    return f"{hashlib.md5(str(flattened_module).encode()).hexdigest()}_{get_rank()}.onnx"


def _has_python_op(model) -> bool:
    return any(node.op_type == "PythonOp" for node in model.graph.node)


def trusted_root(root, shared: bool) -> Path:
    """The export cache folder ``root`` if ``trust`` accepts it (``shared``: a cache shared with a
    group on purpose, ``--ort_export_cache_shared``), else a private folder in its place."""
    return Path(
        trust.trusted_dir(
            Path(root),
            "ORT's export cache",
            "--ort_export_cache_dir (or --ort_export_cache_shared for a cache shared with a group on purpose)",
            shared_below=Path(os.path.abspath(root)) if shared else None,
        )
    )


def subfolder(folder: Path, shared: bool) -> Path:
    """``folder`` below the cache root, created group-writable in a shared cache, else private."""
    if shared:
        folder.mkdir(mode=0o770, parents=True, exist_ok=True)
    else:
        trust.private_dir(folder)
    return folder


def cached_export(original, **kwargs):
    """Call ORT's ``_get_exported_model`` (``original``) with the cache made safe (see above)."""
    root = kwargs.get("ortmodule_cache_dir")
    if not root:
        return original(**kwargs)
    uncached = {**kwargs, "ortmodule_cache_dir": ""}
    module = kwargs["flattened_module"]
    record = ACTIVE_EXPORT_RECORD.get()
    if record is not None:
        record.export_cache_entry = None  # set below once this export's entry is known to be usable
    settings = {
        k: kwargs.get(k)
        for k in ("onnx_opset_version", "enable_custom_autograd_function", "enable_zero_stage3_support")
    }
    # Whether ORT's export hook may flag sparse labels (compat._bridge_sparsity_switches).
    settings["label_sparsity"] = record.enable_label_sparsity if record is not None else None
    # Whether SDPA exports as PyTorch's CPU flash-attention kernel (symbolics/flash_attention.py).
    settings["flash_attention"] = record is not None and "flash_attention" in record.kernel_swaps
    shared = record is not None and record.export_cache_shared
    root = trusted_root(root, shared)
    try:
        import filelock

        entry = subfolder(
            root / entry_key(module, kwargs["model_info_for_export"], kwargs["flatten_module_inputs"], settings),
            shared,
        )
        lock = filelock.FileLock(str(entry / ".lock"))
        lock.acquire()
    except OSError as exc:
        _warn_once(
            f"ort_hf: the export cache {root} cannot be used ({exc}); exporting without it. "
            "Point --ort_export_cache_dir at a writable folder to cache exports."
        )
        return original(**uncached)
    try:
        result = _export_into(entry, original, kwargs, uncached, settings["label_sparsity"] is not False)
    finally:
        lock.release()
    if record is not None and (entry / ort_file_name(module)).exists():
        # the processed, training and session graphs are kept there too (processed_cache,
        # gradient_graph_cache, session_graph_cache)
        record.export_cache_entry = entry
    return result


def _export_into(entry: Path, original, kwargs: dict, uncached: dict, label_sparsity: bool):
    if (entry / _UNCACHEABLE).exists():
        return original(**uncached)
    graph = entry / ort_file_name(kwargs["flattened_module"])
    complete = graph.with_suffix(".complete")
    if graph.exists() and not complete.exists():
        logger.warning("ort_hf: removing %s, an export cache entry whose write never finished.", graph)
        graph.unlink()
    if graph.exists() and not trust.verified(graph):
        _warn_once(
            f"ort_hf: the export cache entry {graph} does not match the hash recorded when it was exported; "
            "not loading it, exporting again."
        )
        trust.forget(graph)
        complete.unlink(missing_ok=True)
    hit = graph.exists()
    schema_file = graph.with_suffix(".schema.json")
    functions_file = graph.with_suffix(".functions.json")
    config_file = graph.with_suffix(".config.json")
    module = kwargs["flattened_module"]
    if hit:
        restored, stale = _restore(graph, schema_file, functions_file, config_file)
        if restored is not None:
            set_config_fields(module, restored[2])  # what the export's forward set (see _store_config)
            restored = restored[:2]
            if label_sparsity:
                record = ACTIVE_EXPORT_RECORD.get()
                python_op_cache.note_label_flags(kwargs["flattened_module"], record and record.runtime_inspector)
            return restored
        if stale:  # ORT's own loading of the file would miss what its PythonOps need: export again
            logger.info("ort_hf: exporting again, not loading %s: %s.", graph, stale)
            for path in (graph, schema_file, functions_file, config_file):
                trust.forget(path)
            complete.unlink(missing_ok=True)
            hit = False
    before = config_fields(module)
    try:
        result = original(**{**kwargs, "ortmodule_cache_dir": str(entry)})
    except Exception as exc:
        if not hit and not isinstance(exc, OSError):
            raise  # the export itself failed: nothing to do with the cache
        graph.unlink(missing_ok=True)
        complete.unlink(missing_ok=True)
        _warn_once(
            f"ort_hf: the export cache entry {graph} could not be {'read' if hit else 'written'} "
            f"({type(exc).__name__}: {exc}); exporting without the cache."
        )
        return original(**uncached)
    if not hit:
        try:
            functions, refusal = (
                python_op_cache.describe(result[0], kwargs["flattened_module"], label_sparsity)
                if _has_python_op(result[0])
                else (None, None)
            )
            if refusal:
                logger.info("ort_hf: the exported graph is not cached: %s.", refusal)
                graph.unlink(missing_ok=True)
                (entry / _UNCACHEABLE).touch()
            else:
                if functions is not None:
                    functions_file.write_text(json.dumps(functions))
                    trust.record(functions_file)
                trust.record(graph)
                _store_schema(schema_file, result[1])
                _store_config(config_file, config_changes(before, module))
                complete.touch()
        except OSError as exc:
            graph.unlink(missing_ok=True)
            _warn_once(f"ort_hf: could not finish the export cache entry {graph} ({exc}); it will be redone.")
    else:  # a hit whose kept schema was missing or not usable: keep the one ORT's pass just produced
        try:
            _store_schema(schema_file, result[1])
            _store_config(config_file, config_changes(before, module))
        except OSError:
            pass  # the next hit runs ORT's output-structure pass, as this one did
    return result


def _store_schema(schema_file: Path, schema) -> None:
    """Keep the output schema ORT's pass produced beside the graph (see ``output_schema``); a schema
    that would not read back equal is not kept, and hits then run the pass."""
    from . import output_schema

    text = output_schema.dumps(schema)
    if text is None:
        trust.forget(schema_file)
        return
    schema_file.write_text(text)
    trust.record(schema_file)


def _store_config(config_file: Path, changes: dict) -> None:
    """Keep the config fields the export's PyTorch forward set (transformers' classifiers set
    ``problem_type`` on their first forward): a hit runs no forward, and sets them from here, so
    the run saves the config a run without the cache would."""
    config_file.write_text(json.dumps(changes, sort_keys=True))
    trust.record(config_file)


def _restore(graph: Path, schema_file: Path, functions_file: Path, config_file: Path):
    """``(the cached graph, the output schema kept beside it, the config fields to set), None)``,
    the first two as ORT's ``_get_exported_model`` returns them, without its output-structure pass
    (a PyTorch forward); ``(None, None)`` when the schema or the config record is missing, not the
    file recorded, unreadable or (the schema) does not place one tensor per graph output (ORT's own
    loading then runs the pass); ``(None, why)`` when a graph with PythonOps cannot be restored
    (``python_op_cache``), so must be exported again."""
    import onnx

    from . import output_schema

    try:
        model = onnx.load(str(graph))
    except Exception as exc:  # a protobuf DecodeError, an OSError: the entry is of no use
        return None, f"it does not load ({exc})"
    python_ops = _has_python_op(model)
    if python_ops:
        if not (functions_file.exists() and trust.verified(functions_file)):
            return None, "its PythonOps' record is missing or not the file recorded"
        try:
            why = python_op_cache.restore(model, json.loads(functions_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"its PythonOps' record does not read ({exc})"
        if why:
            return None, why
    if not (schema_file.exists() and trust.verified(schema_file)):
        return None, "its output schema is missing" if python_ops else None
    try:
        schema = output_schema.loads(schema_file.read_text())
    except (OSError, ValueError, ImportError, AttributeError) as exc:
        logger.info("ort_hf: not using the output schema kept in %s (%s)", schema_file, exc)
        return None, "its output schema does not read" if python_ops else None
    if output_schema.tensor_count(schema) != len(model.graph.output):
        logger.info("ort_hf: the output schema in %s does not match its graph's outputs", schema_file)
        return None, "its output schema does not match it" if python_ops else None
    try:
        changes = json.loads(config_file.read_text()) if trust.verified(config_file) else None
    except (OSError, ValueError):
        changes = None
    if not isinstance(changes, dict):
        return None, "its config record is missing" if python_ops else None
    return (model, schema, changes), None
