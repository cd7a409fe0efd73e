"""The structure of a model's outputs, as ORT's export records it, written beside a cached graph.

ORT 1.19.2 learns the structure of the model's outputs (``ModelOutput`` class, keys, which are
tensors, their dtypes and ranks: its "output schema") from a whole PyTorch forward before every
export, and runs that forward on an export-cache hit too, only for that schema. The export cache
(``export_cache``) stores the schema beside the graph, in the same keyed entry, so a hit loads
both and runs no forward. A schema is written only when reading it back gives an equal one, type
for type (:func:`dumps` returns None otherwise, and hits then run ORT's pass as before).

The format is JSON: ``None``, strings and booleans/ints/floats as themselves (tagged), ORT's
``_TensorStub`` with its five fields, and sequences and mappings with their class's import path
(``transformers.modeling_outputs.SequenceClassifierOutput``, ``builtins.tuple``), rebuilt as ORT
builds them (``_make`` for named tuples, ``cls(**items)`` for mappings).
"""

from __future__ import annotations

import importlib
import json
from collections import abc


def _stub_type():
    from onnxruntime.training.utils.torch_io_helper import _TensorStub

    return _TensorStub


_STUB_FIELDS = ("tensor_idx", "name", "dtype", "shape", "shape_dims")


class _NotRepresentable(TypeError):
    pass


def dumps(schema) -> str | None:
    """``schema`` as JSON text, or None when it cannot be written so that :func:`loads` rebuilds it equal."""
    try:
        text = json.dumps(_encode(schema))
        return text if same(loads(text), schema) else None
    except (_NotRepresentable, ValueError, TypeError, ImportError, AttributeError):
        return None


def loads(text: str):
    """The schema :func:`dumps` wrote; ValueError when the text is not one (ImportError or
    AttributeError when a class it names is gone)."""
    try:
        return _decode(json.loads(text))
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not an output schema: {exc!r}") from exc


def tensor_count(schema) -> int:
    """How many tensors (graph outputs) the schema places."""
    if isinstance(schema, _stub_type()):
        return 1
    if isinstance(schema, abc.Mapping):
        return sum(tensor_count(v) for v in schema.values())
    if isinstance(schema, abc.Sequence) and not isinstance(schema, str):
        return sum(tensor_count(v) for v in schema)
    return 0


def same(a, b) -> bool:
    """Equal, with the same type at every level (ORT's stubs compare every field)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, _stub_type()):
        return all(getattr(a, f) == getattr(b, f) for f in _STUB_FIELDS)
    if isinstance(a, abc.Mapping):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, abc.Sequence) and not isinstance(a, str):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _class_path(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _encode(value):
    if value is None or isinstance(value, (str, bool, int, float)):
        return {"kind": "value", "type": type(value).__name__, "value": value}
    if isinstance(value, _stub_type()):
        shape = value.shape
        if shape is not None and not (isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape)):
            raise _NotRepresentable(f"stub shape {shape!r}")
        fields = {f: getattr(value, f) for f in _STUB_FIELDS}
        if shape is not None:
            fields["shape"] = [list(shape), type(shape).__name__]
        return {"kind": "tensor", **fields}
    if isinstance(value, abc.Mapping):
        if not all(isinstance(k, str) for k in value):
            raise _NotRepresentable("a mapping with non-string keys")
        return {"kind": "map", "type": _class_path(type(value)), "items": [[k, _encode(v)] for k, v in value.items()]}
    if isinstance(value, abc.Sequence):
        return {"kind": "seq", "type": _class_path(type(value)), "items": [_encode(v) for v in value]}
    raise _NotRepresentable(type(value).__name__)


_VALUE_TYPES = {"NoneType": type(None), "str": str, "bool": bool, "int": int, "float": float}


def _resolve(path: str, base) -> type:
    module, _, qualname = path.partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, base)) or issubclass(found, str):
        raise ValueError(f"{path} is not a {base.__name__} class")
    return found


def _decode(node):
    if not isinstance(node, dict):
        raise ValueError(f"not a schema node: {node!r}")
    kind = node.get("kind")
    if kind == "value":
        value = node["value"]
        if type(value) is not _VALUE_TYPES[node["type"]]:
            raise ValueError(f"a {node['type']} written as {value!r}")
        return value
    if kind == "tensor":
        fields = {f: node[f] for f in _STUB_FIELDS}
        if fields["shape"] is not None:
            dims, container = fields["shape"]
            fields["shape"] = {"list": list, "tuple": tuple}[container](dims)
        return _stub_type()(**fields)
    if kind == "map":
        cls = _resolve(node["type"], abc.Mapping)
        return cls(**{k: _decode(v) for k, v in node["items"]})
    if kind == "seq":
        cls = _resolve(node["type"], abc.Sequence)
        items = [_decode(v) for v in node["items"]]
        return cls._make(items) if hasattr(cls, "_make") else cls(items)
    raise ValueError(f"unknown schema node kind {kind!r}")
