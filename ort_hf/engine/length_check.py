"""Find sizes the training export bakes in: export a model at two sequence lengths and diff the graphs.

ORTModule exports a model once, on the first batch, with dynamic batch and sequence axes, and
runs every later batch through that graph. A size the TorchScript tracer recorded as a number
instead of as ``Shape`` arithmetic (``.tolist()`` / ``.item()`` / ``torch.tensor(size)``, or a
``.size()`` read off a node whose shape ONNX could not infer, so that the exporter kept the traced
one) is then a ``Constant`` holding the first batch's value, and a batch of another length fails
in ORT (a ``Reshape``, ``Gather`` or ``ScatterElements`` out of range) or, worse, computes the
wrong thing.

:func:`find_length_constants` exports the model as ORT does (TorchScript exporter, training mode,
ORT's and ort_hf's symbolics, every input's batch and sequence axes dynamic) at the batch's own
length and at a shorter one, and reports each node whose constant value or attributes differ,
with the model source line that produced it, plus whatever the graphs do not share. A diagnostic,
run on demand (two exports of the model).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import io
import linecache
import re
import warnings
from dataclasses import dataclass, field

import torch

from .._onnx_graph import readers_of

_FRAME = re.compile(r"^(?P<path>.+)\((?P<line>\d+)\): (?P<func>\S+)$")
_TORCH_DIR = str(torch.__path__[0])


@dataclass
class LengthDependentNode:
    """A node of the exported graph that is not the same at the two lengths."""

    name: str
    op_type: str
    values: tuple  # (at the first length, at the second): a Constant's value, else the attributes
    consumers: list[str]  # "<op_type> <name>" of the nodes it feeds, through any shape arithmetic
    source: str | None  # "path:line: code", the model's line that traced it (or its first consumer)

    def __str__(self) -> str:
        where = f"\n      from {self.source}" if self.source else ""
        return (
            f"{self.op_type} {self.name}: {_short(self.values[0])} -> {_short(self.values[1])}, feeds "
            f"{', '.join(self.consumers) or 'nothing'}{where}"
        )


def _short(value, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class LengthReport:
    """What :func:`find_length_constants` found; empty (falsy) when the graphs are the same."""

    lengths: tuple[int, int]
    nodes: list[LengthDependentNode] = field(default_factory=list)
    structure: list[str] = field(default_factory=list)  # nodes found in one graph only
    tracer_warnings: list[str] = field(default_factory=list)  # torch's TracerWarnings, "path:line: message"

    def __bool__(self) -> bool:
        return bool(self.nodes or self.structure)

    def __str__(self) -> str:
        a, b = self.lengths
        if not self:
            return f"The exported graph is the same at sequence lengths {a} and {b}."
        lines = [f"The exported graph differs between sequence lengths {a} and {b}:"]
        lines += [f"  {node}" for node in self.nodes]
        lines += [f"  structure: {s}" for s in self.structure]
        if self.tracer_warnings:
            lines.append("Tracer warnings (each a value the trace may have fixed):")
            lines += [f"  {w}" for w in self.tracer_warnings]
        return "\n".join(lines)


def find_length_constants(
    model: torch.nn.Module, batch: dict, *, other_length: int | None = None, opset_version: int = 16
) -> LengthReport:
    """Export ``model`` on ``batch`` and on ``batch`` cut to ``other_length`` (default: 2 shorter, or
    2 longer, repeating the last position, when the batch is 3 or shorter) and report what differs.

    The sequence length is ``input_ids``' second dimension (else the first 2-D tensor's); every
    tensor of ``batch`` with that second dimension is cut or extended. The model is exported in
    training mode as ORT exports it; its parameters and mode are left as they were."""
    from .runtime import ensure_engine, register_symbolics
    from .trace_fixes import apply_trace_fixes

    register_symbolics(ensure_engine(), opset_version)
    _register_ort_symbolics(opset_version)
    apply_trace_fixes(model)  # as wrap_model does: the graph compared is the one ORT would get
    inputs = {k: v for k, v in batch.items() if torch.is_tensor(v)}
    length = _sequence_length(inputs)
    if other_length is None:
        other_length = length - 2 if length > 3 else length + 2
    if other_length == length or other_length < 1:
        raise ValueError(f"other_length must be a positive length other than the batch's ({length})")
    caught: list[str] = []
    graphs = [
        _export(model, _at_length(inputs, length, n), length=n, opset_version=opset_version, caught=caught)
        for n in (length, other_length)
    ]
    report = _diff(*graphs)
    report.lengths = (length, other_length)
    report.tracer_warnings = list(dict.fromkeys(caught))
    return report


def _register_ort_symbolics(opset_version: int) -> None:
    # ORTModule registers its own symbolic table (prim::ConstantChunk, aten::embedding, ...) for its
    # opset each time one is built; the graph compared must be the one ORT gets.
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register_all(opset_version)


def _sequence_length(inputs: dict) -> int:
    ids = inputs.get("input_ids")
    if ids is None or ids.dim() < 2:
        ids = next((v for v in inputs.values() if v.dim() >= 2), None)
    if ids is None:
        raise ValueError("find_length_constants needs a batch with a 2-D tensor (input_ids) to vary the length of")
    return ids.shape[1]


def _at_length(inputs: dict, length: int, new: int) -> dict:
    out = {}
    for name, value in inputs.items():
        if value.dim() >= 2 and value.shape[1] == length and new != length:
            if new < length:
                value = value[:, :new]
            else:  # repeat the last position: padding stays padding, an unpadded row stays valid
                value = torch.cat([value, value[:, -1:].expand(-1, new - length, *value.shape[2:])], dim=1)
        out[name] = value.contiguous()
    return out


class _Outputs(torch.nn.Module):
    """The model on positional tensors, returning its tensor outputs (loss first when it has one)."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names
        params = inspect.signature(model.forward).parameters
        self.extra = {"use_cache": False} if "use_cache" in params else {}

    def forward(self, *tensors):
        out = self.model(**dict(zip(self.names, tensors)), **self.extra)
        values = out.values() if isinstance(out, dict) else (out if isinstance(out, tuple) else (out,))
        return tuple(v for v in values if torch.is_tensor(v))


@contextlib.contextmanager
def _quiet_verbose_export():
    # verbose=True is what keeps each node's source stack (ONNX doc_string); it also turns on the
    # exporter's C++ log, which prints the whole graph. The log switch is left off.
    from torch.onnx._internal.torchscript_exporter import utils

    original = utils.setup_onnx_logging
    utils.setup_onnx_logging = lambda verbose: contextlib.nullcontext()
    try:
        yield
    finally:
        utils.setup_onnx_logging = original


def _export(model, inputs: dict, *, length: int, opset_version: int, caught: list[str]):
    import onnx

    names = list(inputs)
    axes = {
        n: ({0: "batch", 1: "sequence"} if v.dim() >= 2 and v.shape[1] == length else {0: "batch"})
        for n, v in inputs.items()
    }
    wrapper = _Outputs(model, names)
    was_training = model.training
    model.train()
    f = io.BytesIO()
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as records, _quiet_verbose_export():
            warnings.simplefilter("always", torch.jit.TracerWarning)
            outputs = wrapper(*inputs.values())
            out_names = [f"output_{i}" for i in range(len(outputs))]
            axes.update({n: {d: f"{n}_dim{d}" for d in range(o.dim())} for n, o in zip(out_names, outputs)})
            torch.onnx.export(
                wrapper,
                tuple(inputs.values()),
                f,
                input_names=names,
                output_names=out_names,
                dynamic_axes=axes,
                opset_version=opset_version,
                training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False,
                export_params=False,
                keep_initializers_as_inputs=True,
                verbose=True,
                dynamo=False,
            )
    finally:
        model.train(was_training)
    for r in records:
        if issubclass(r.category, torch.jit.TracerWarning):
            caught.append(f"{r.filename}:{r.lineno}: {str(r.message).split('. ')[0]}")
    return onnx.load_from_string(f.getvalue())


def _key(node) -> tuple[str, str]:
    return node.op_type, node.name.rpartition("/")[0]  # the op and its module scope, not its counter


# Ops that build a shape out of sizes: a baked size is reported at what it reaches through them.
_SHAPE_ARITHMETIC = {"Unsqueeze", "Squeeze", "Concat", "Cast", "Gather", "Add", "Sub", "Mul", "Div", "Identity"}


def _diff(a, b) -> LengthReport:
    report = LengthReport(lengths=(0, 0))
    nodes_a, nodes_b = list(a.graph.node), list(b.graph.node)
    readers = readers_of(nodes_a)
    matcher = difflib.SequenceMatcher(None, [_key(n) for n in nodes_a], [_key(n) for n in nodes_b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for x, y in zip(nodes_a[i1:i2], nodes_b[j1:j2]):
                vx, vy = _attributes(x), _attributes(y)
                if vx != vy:
                    reached = _reached(x, readers, through=_is_int_constant(x))
                    source = _source(x) or next((_source(n) for n in reached if _source(n)), None)
                    report.nodes.append(
                        LengthDependentNode(
                            x.name, x.op_type, (vx, vy), sorted({f"{n.op_type} {n.name}" for n in reached}), source
                        )
                    )
            continue
        only_a = ", ".join(f"{n.op_type} {n.name}" for n in nodes_a[i1:i2]) or "nothing"
        only_b = ", ".join(f"{n.op_type} {n.name}" for n in nodes_b[j1:j2]) or "nothing"
        report.structure.append(f"{only_a} (first length) vs {only_b} (second)")
    return report


def _is_int_constant(node) -> bool:
    from onnx import TensorProto

    return node.op_type == "Constant" and any(
        a.name == "value" and a.t.data_type in (TensorProto.INT64, TensorProto.INT32) for a in node.attribute
    )


def _reached(node, readers: dict, through: bool) -> list:
    """The nodes reading ``node``'s outputs; with ``through`` (an integer constant: a size), the
    nodes it reaches through shape arithmetic instead of that arithmetic."""
    seen, reached, todo = set(), [], [node]
    while todo:
        for reader in (r for out in todo.pop().output for r in readers.get(out, [])):
            if id(reader) in seen:
                continue
            seen.add(id(reader))
            if through and reader.op_type in _SHAPE_ARITHMETIC:
                todo.append(reader)
            else:
                reached.append(reader)
    return reached


def _attributes(node):
    from onnx import helper, numpy_helper

    values = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if attr.type == attr.TENSOR:
            value = numpy_helper.to_array(value).tolist()
        elif attr.type in (attr.GRAPH, attr.GRAPHS):
            value = str(value)  # a subgraph: compared as text
        values[attr.name] = value
    if node.op_type == "Constant" and set(values) == {"value"}:
        return values["value"]
    return values


def _source(node) -> str | None:
    """The innermost frame of the node's source stack outside torch: the model's line."""
    for line in node.doc_string.splitlines():
        match = _FRAME.match(line.strip())
        if match and not match["path"].startswith(_TORCH_DIR):
            path, lineno = match["path"], int(match["line"])
            return f"{path}:{lineno}: {linecache.getline(path, lineno).strip()}"
    return None
