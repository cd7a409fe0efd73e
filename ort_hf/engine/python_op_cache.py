"""PythonOps in ORT's export cache: what a cached graph with custom autograd Functions needs in a
fresh process, written beside it when it is stored and put back when it is loaded.

ORT's exporter (``_custom_autograd_function_exporter._default_export``) does two things for each
PythonOp that a graph loaded from disk lacks. It registers the Function class under its qualified
name (``register_torch_autograd_function``, ``register_custom_function_schema_supplementary``). And
it passes every argument that is not a tensor, a number or a tuple of numbers by address: the
node's ``input_pointer_scalars`` hold ``id(arg)``, kept alive by
``register_miscellaneous_const_input``. An address means nothing in another process.

:func:`describe` records each Function's qualified name with a digest of its source file, and the
value of each argument passed by address; only None and strings are kept (ORT's label flag passes
``"label"``, ort_hf's fused head a missing bias), anything else leaves the graph uncached.
:func:`restore` imports and registers the Functions again (a changed or missing source is a miss)
and re-creates the arguments, writing their new addresses into the graph.

ORT's label-sparsity flag (``FlagAndPrintDensity``, put by the export's hook on each
``nn.CrossEntropyLoss`` whose labels are sparse in the batch being exported) depends on that
batch, not only on the code: a graph is kept only when its flags are the ones its modules declare
(``label_flags_expected``, e.g. ModuleWithLoss's, which is in the key through the module's repr).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import inspect
from pathlib import Path

FLAG = "onnxruntime.training.ortmodule._runtime_inspector.FlagAndPrintDensity"
POINTERS = "input_pointer_scalars"  # the attribute holding ORT's by-address arguments


def attributes(node) -> dict:
    return {a.name: a for a in node.attribute}


def pointer_ops(model) -> dict:
    """The ``POINTERS`` attribute of each PythonOp node that has one, by node name."""
    return {
        node.name: attributes(node)[POINTERS]
        for node in model.graph.node
        if node.op_type == "PythonOp" and POINTERS in attributes(node)
    }


def without_pointers(model) -> bytes:
    """``model`` serialised deterministically with every by-address argument zeroed: the same bytes
    in every process for the same graph (what the kept graphs' digests read)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for pointers in pointer_ops(copy).values():
        pointers.ints[:] = [0] * len(pointers.ints)
    return copy.SerializeToString(deterministic=True)


def take_pointers(kept, ours: dict) -> bool:
    """Give each PythonOp of ``kept`` (a graph kept by another process) this run's by-address
    arguments from ``ours`` (``pointer_ops`` of this run's graph), by node name; ORT's builders keep
    the names. False, with ``kept`` not to be used, where one has no counterpart of its length."""
    for name, pointers in pointer_ops(kept).items():
        if name not in ours or len(ours[name].ints) != len(pointers.ints):
            return False
        pointers.ints[:] = ours[name].ints
    return True


def _function_name(node) -> str:
    return attributes(node)["func_name"].s.decode()


def _resolve(name: str):
    """The autograd Function named ``name`` (module path, then qualified name), or None."""
    import torch

    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # not a module, or one that fails to import: a miss, re-exported
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
        return found if isinstance(found, type) and issubclass(found, torch.autograd.Function) else None
    return None


def _source_digest(function) -> str | None:
    try:
        return hashlib.sha256(Path(inspect.getsourcefile(function)).read_bytes()).hexdigest()
    except (OSError, TypeError):
        return None


def describe(model, flattened_module, label_sparsity: bool = True) -> tuple[dict | None, str | None]:
    """``(record, None)`` for a graph whose PythonOps a fresh process can restore, else
    ``(None, why not)``. Run in the exporting process, where ORT holds every argument it passed by
    address. ``label_sparsity``: whether ORT's export hook could flag labels at all."""
    functions: dict[str, str] = {}
    pointers: list[list] = []
    flags = 0
    for index, node in enumerate(model.graph.node):
        if node.op_type != "PythonOp":
            continue
        name = _function_name(node)
        function = _resolve(name)
        digest = _source_digest(function) if function is not None else None
        if digest is None:
            return None, f"its autograd Function {name} cannot be imported by name, or its source read"
        functions[name] = digest
        addresses = attributes(node).get(POINTERS)
        values = [ctypes.cast(address, ctypes.py_object).value for address in (addresses.ints if addresses else [])]
        for value in values:
            if value is not None and not isinstance(value, str):
                return None, f"{name} takes a {type(value).__name__} argument, which ORT passes by address"
        if values:
            pointers.append([index, values])
        if name == FLAG:
            if values != ["label"]:
                return None, "ORT flagged an input other than the labels"
            flags += 1
    expected = (
        sum(getattr(module, "label_flags_expected", 0) for module in flattened_module.modules())
        if label_sparsity
        else 0
    )
    if flags != expected:
        return None, f"ORT's export flagged {flags} label inputs where the modules declare {expected}"
    return {"functions": functions, "pointers": pointers}, None


def restore(model, record: dict) -> str | None:
    """Register the Functions of ``model``'s PythonOps and write the addresses of re-created
    arguments into it, as ORT's export would have; None, or why the graph cannot be used."""
    from onnxruntime.capi._pybind_state import register_miscellaneous_const_input, register_torch_autograd_function
    from onnxruntime.training.ortmodule._custom_autograd_function_exporter import (
        register_custom_function_schema_supplementary,
    )

    used = {_function_name(node) for node in model.graph.node if node.op_type == "PythonOp"}
    if used != set(record["functions"]):
        return "its PythonOps are not the ones recorded beside it"
    functions = {}
    for name, digest in record["functions"].items():
        function = _resolve(name)
        if function is None or _source_digest(function) != digest:
            return f"the autograd Function {name} is gone or its source changed"
        functions[name] = function
    for index, values in record["pointers"]:
        node = model.graph.node[index] if index < len(model.graph.node) else None
        addresses = attributes(node).get(POINTERS) if node is not None and node.op_type == "PythonOp" else None
        if addresses is None or len(addresses.ints) != len(values):
            return "its PythonOps' arguments are not the ones recorded beside it"
    for name, function in functions.items():
        register_torch_autograd_function(name, function)
        register_custom_function_schema_supplementary(function)
    for index, values in record["pointers"]:
        objects = [None if value is None else str(value) for value in values]
        for value in objects:
            register_miscellaneous_const_input(value)  # held for the process's life, as ORT's export does
        attributes(model.graph.node[index])[POINTERS].ints[:] = [id(value) for value in objects]
    return None


def note_label_flags(flattened_module, inspector) -> None:
    """Note in ORT's runtime inspector what its export hook notes when it flags labels (ORT's banner
    then reads ``Label Sparsity: ON`` with the density, as after an export), for a graph loaded with
    the flags its modules declare (``flagged_labels``)."""
    if inspector is None:
        return
    for name, module in flattened_module.named_modules():
        for child, density in (module.flagged_labels() if hasattr(module, "flagged_labels") else {}).items():
            inspector._sceloss_module_to_ignore_density_map[f"{name}.{child}" if name else child] = density
