"""Padding elimination for ORT's CPU build: the token-wise layers run on the real tokens only.

ORT 1.19.2's ``PaddingElimination`` graph transformer and its ``FlattenAndUnpad`` /
``PadAndUnflatten`` kernels exist only in its CUDA build. This is the same rewrite in standard
ONNX ops, applied to the exported forward graph before ORT builds its gradient graph:

* the word embedding looks up the non-padding tokens only (``attention_mask != 0``), so the
  hidden states are ``[N, H]`` instead of ``[B, S, H]``;
* every node that works token by token (projections by a weight matrix, bias, activation,
  dropout, residual add, layer/RMS norm over the last axis) runs on those ``N`` rows; other
  inputs aligned with the tokens (position and token-type embeddings) are unpadded to match;
* before anything that mixes tokens (attention's head reshape, the pooler's first-token gather,
  a label shift) and at the graph's outputs, the ``[B, S, ...]`` layout is restored by a gather
  that fills each padding position with a real row's values.

What is trained is unchanged when nothing that trains reads a padding position: attention masks
them out (every HF model does this with ``attention_mask``), and the caller checks the rest per
batch (:func:`padding_unread`). Outputs at padding positions hold other rows' values, as ORT's CUDA
rewrite leaves them zero; neither is PyTorch's value there.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, numpy_helper

_UNARY = {
    "Cast",
    "Relu",
    "Tanh",
    "Sigmoid",
    "Erf",
    "Sqrt",
    "Reciprocal",
    "Neg",
    "Exp",
    "Log",
    "Abs",
    "Identity",
    "Softplus",
    "Gelu",
    "FastGelu",
    "QuickGelu",
    "IsNaN",
    "IsInf",
    "Not",
    "Sign",
    "Floor",
    "Ceil",
    "Round",
}
_ELEMENTWISE = _UNARY | {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Where",
    "Max",
    "Min",
    "Equal",
    "Greater",
    "Less",
    "GreaterOrEqual",
    "LessOrEqual",
    "And",
    "Or",
    "Clip",
    "BiasGelu",
    "Dropout",
    "BiasDropout",
}
_LAST_AXIS = {"LayerNormalization", "SimplifiedLayerNormalization", "Softmax", "LogSoftmax"}
_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare"}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
_SUFFIX = "/unpadded"
_PREFIX = "ort_hf_unpad/"


@dataclass
class Rewrite:
    """What :func:`eliminate_padding` changed: how many nodes run unpadded, and how many times the
    padded layout is rebuilt (attention, outputs) or a token-aligned input is unpadded."""

    unpadded_nodes: int
    pads: int
    unpads: int


def worth_eliminating(inputs: dict) -> bool:
    """Whether a graph built for this batch should eliminate padding: ``input_ids`` with an
    ``attention_mask`` that is padding for at least ``1 - SPARSITY_THRESHOLD`` of the positions (ORT's
    rule for its CUDA padding elimination), padding that nothing reads (:func:`padding_unread`), and
    per-token labels, if any, on at least ``SPARSITY_THRESHOLD`` of the real tokens. With fewer labels (masked LM),
    ORT's label sparsity computes the LM head on the labelled rows only, which the padded layout this
    rewrite restores before the loss would undo."""
    import torch

    from .options import SPARSITY_THRESHOLD

    ids, mask, labels = inputs.get("input_ids"), inputs.get("attention_mask"), inputs.get("labels")
    if not (torch.is_tensor(ids) and torch.is_tensor(mask)) or mask.dim() != 2 or ids.shape != mask.shape:
        return False
    real = int(torch.count_nonzero(mask))
    if real == 0 or real >= SPARSITY_THRESHOLD * mask.numel() or not padding_unread(inputs):
        return False
    if torch.is_tensor(labels) and labels.shape[:2] == mask.shape:
        return int(torch.count_nonzero(labels != -100)) >= SPARSITY_THRESHOLD * real
    return True


def padding_unread(inputs: dict) -> bool:
    """Whether nothing that trains reads this batch's padding positions, as the rewrite requires:
    every row is padded on the right (so a causal LM's shifted label, a first-token pooler and
    attention read real positions only), and per-token ``labels`` are -100 on the padding."""
    import torch

    mask, labels = inputs.get("attention_mask"), inputs.get("labels")
    if not torch.is_tensor(mask) or mask.dim() != 2:
        return True
    real = (mask != 0).to(torch.int8)
    if bool((real[:, 1:] > real[:, :-1]).any()):
        return False  # a padding position before a real one: left or inner padding
    if not torch.is_tensor(labels) or labels.shape[:2] != mask.shape:
        return True
    return not bool((labels[real == 0] != -100).any())


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class _Graph:
    """The rewrite's state: the new node list and what each tensor became."""

    def __init__(self, model: onnx.ModelProto, ids: str, mask: str):
        inferred = onnx.shape_inference.infer_shapes(model)
        self.rank: dict[str, int] = {}
        self.elem: dict[str, int] = {}
        self.dims: dict[str, list] = {}  # the exporter's symbolic dims, which name the tokens' B and S
        for v in [*inferred.graph.input, *model.graph.value_info, *inferred.graph.value_info, *inferred.graph.output]:
            if v.type.tensor_type.HasField("shape"):
                dims = [
                    d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                    for d in v.type.tensor_type.shape.dim
                ]
                self.rank[v.name] = len(dims)
                self.dims.setdefault(v.name, dims)
            self.elem.setdefault(v.name, v.type.tensor_type.elem_type)
        self.tokens = self.dims[ids][:2]
        for init in model.graph.initializer:
            self.rank[init.name] = len(init.dims)
        self.constants = {
            n.output[0]: numpy_helper.to_array(_attr(n, "value"))
            for n in model.graph.node
            if n.op_type == "Constant" and _attr(n, "value") is not None
        }
        self.region: dict[str, int] = {}  # tensor -> its rank before unpadding (3: [B, S, H] -> [N, H])
        self.padded: set[str] = set()
        self.typed: dict[str, int] = {}
        self.twins: dict[str, str] = {}  # tensor -> the name of its rows, when the rewrite made them
        self.unpadded: dict[str, str] = {}  # out-of-region tensor -> its unpadded twin
        self.nodes: list = []
        self.count = 0
        self.stats = Rewrite(0, 0, 0)
        self.consumers: dict[str, int] = {}
        for n in model.graph.node:
            for i in n.input:
                self.consumers[i] = self.consumers.get(i, 0) + 1
        for o in model.graph.output:
            self.consumers[o.name] = self.consumers.get(o.name, 0) + 1
        for n in model.graph.node:  # onnx's inference does not know ATen's embedding
            indices = _embedding_indices(n)
            if indices is not None and n.output[0] not in self.rank and indices in self.rank:
                self.rank[n.output[0]] = self.rank[indices] + 1
        self.producer: dict[str, onnx.NodeProto] = {}
        g = _PREFIX
        self.nodes += [
            helper.make_node(
                "Constant", [], [g + "minus1"], value=helper.make_tensor("", TensorProto.INT64, [1], [-1])
            ),
            helper.make_node("Constant", [], [g + "one"], value=helper.make_tensor("", TensorProto.INT64, [], [1])),
            helper.make_node("Constant", [], [g + "zero"], value=helper.make_tensor("", TensorProto.INT64, [], [0])),
            helper.make_node("Reshape", [mask, g + "minus1"], [g + "flat_mask"]),
            helper.make_node("Cast", [g + "flat_mask"], [g + "keep"], to=TensorProto.BOOL),
            helper.make_node("Cast", [g + "keep"], [g + "keep64"], to=TensorProto.INT64),
            helper.make_node("NonZero", [g + "keep"], [g + "nonzero"]),
            helper.make_node("Reshape", [g + "nonzero", g + "minus1"], [g + "idx"]),  # real positions, [N]
            helper.make_node("CumSum", [g + "keep64", g + "zero"], [g + "cumsum"]),
            helper.make_node("Sub", [g + "cumsum", g + "one"], [g + "row"]),
            helper.make_node("Max", [g + "row", g + "zero"], [g + "inv"]),  # [B*S] -> a real row
            helper.make_node("Shape", [mask], [g + "bs"]),  # [B, S]
            helper.make_node(
                "Constant", [], [g + "no_padding_idx"], value=helper.make_tensor("", TensorProto.INT64, [], [-1])
            ),
            helper.make_node(
                "Constant", [], [g + "false"], value=helper.make_tensor("", TensorProto.BOOL, [], [False])
            ),
        ]

    def aligned(self, tensor: str, exact: bool = False) -> bool:
        """Whether ``tensor``'s first two axes are the tokens' ``[B, S]`` (or broadcast over them)."""
        dims = self.dims.get(tensor)
        if dims is None or len(dims) < 2 or None in self.tokens:
            return False
        if exact:
            return dims[:2] == self.tokens
        return all(d == t or d == 1 for d, t in zip(dims[:2], self.tokens))

    def rows(self, data: str, index: str, out: str, dtype: int | None) -> None:
        """``out = data[index]`` along the first axis. Floating-point rows go through ATen's
        ``embedding``, whose backward is PyTorch's threaded ``embedding_dense_backward``: ORT's CPU
        ``GatherGrad`` is serial and, measured on MiniLM, cost more than the rows saved."""
        if dtype in _FLOATS:
            self.typed[out] = dtype  # ORT cannot infer an ATen output's type
            self.nodes.append(
                helper.make_node(
                    "ATen",
                    [data, index, _PREFIX + "no_padding_idx", _PREFIX + "false", _PREFIX + "false"],
                    [out],
                    domain="org.pytorch.aten",
                    operator="embedding",
                )
            )
        else:
            self.nodes.append(helper.make_node("Gather", [data, index], [out], axis=0))

    def name(self, what: str) -> str:
        self.count += 1
        return f"{_PREFIX}{what}_{self.count}"

    def unpadded_name(self, tensor: str) -> str:
        return tensor + _SUFFIX

    def pad(self, tensor: str) -> None:
        """Emit ``tensor`` (its padded ``[B, S, ...]`` form) from its unpadded twin, once."""
        if tensor in self.padded:
            return
        self.padded.add(tensor)
        self.stats.pads += 1
        u = self.unpadded_name(tensor)
        trail, shape, rows = self.name("trail"), self.name("shape"), self.name("rows")
        self.rows(u, _PREFIX + "inv", rows, self.elem.get(tensor))
        self.nodes += [
            helper.make_node("Shape", [u], [trail], start=1),
            helper.make_node("Concat", [_PREFIX + "bs", trail], [shape], axis=0),
            helper.make_node("Reshape", [rows, shape], [tensor]),
        ]

    def unpad(self, tensor: str) -> str:
        """The real tokens' rows of an out-of-region tensor aligned with ``[B, S]`` (see ``aligned``)."""
        if tensor in self.unpadded:
            return self.unpadded[tensor]
        producer = self.producer.get(tensor)
        if producer is not None and self.consumers.get(tensor) == 1:
            indices = _embedding_indices(producer)
            if indices is not None and self.aligned(indices) and self.rank.get(indices) == 2:
                return self._unpad_lookup(producer, indices, tensor)
        self.stats.unpads += 1
        trail, flat_shape, flat, out = (self.name(w) for w in ("trail", "flat_shape", "flat", "rows"))
        src = tensor
        self.nodes.append(helper.make_node("Shape", [tensor], [trail], start=2))
        if not self.aligned(tensor, exact=True):
            full, src = self.name("full"), self.name("expanded")
            self.nodes += [
                helper.make_node("Concat", [_PREFIX + "bs", trail], [full], axis=0),
                helper.make_node("Expand", [tensor, full], [src]),
            ]
        self.nodes += [
            helper.make_node("Concat", [_PREFIX + "minus1", trail], [flat_shape], axis=0),
            helper.make_node("Reshape", [src, flat_shape], [flat]),
        ]
        self.rows(flat, _PREFIX + "idx", out, self.elem.get(tensor))
        self.unpadded[tensor] = out
        return out

    def _unpad_lookup(self, lookup, indices: str, tensor: str) -> str:
        # An embedding whose only reader is token-wise: look up the real tokens' indices instead
        # of gathering the rows of its [B, S, H] output.
        at, emitted = self.nodes.index(lookup), self.nodes
        self.nodes = []
        rows = self.unpad(indices)
        emitted[at:at] = self.nodes
        self.nodes = emitted
        lookup.input[1] = rows
        lookup.output[0] = self.unpadded[tensor] = self.twins[tensor] = tensor + _SUFFIX
        self.stats.unpadded_nodes += 1
        return lookup.output[0]

    def append(self, node) -> None:
        for o in node.output:
            self.producer[o] = node
        self.nodes.append(node)

    def emit_unpadded(self, node, inputs: list[str], rank: int, **attrs) -> None:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(inputs)
        del new.output[:]
        new.output.extend(self.unpadded_name(o) if o else o for o in node.output)
        for name, value in attrs.items():
            for a in new.attribute:
                if a.name == name:
                    new.attribute.remove(a)
                    break
            new.attribute.append(helper.make_attribute(name, value))
        for o in node.output:
            if o:
                self.region[o] = rank
                self.twins[o] = self.unpadded_name(o)
        self.stats.unpadded_nodes += 1
        self.nodes.append(new)


def _embedding_indices(node) -> str | None:
    if node.op_type == "ATen" and _attr(node, "operator") == b"embedding":
        return node.input[1]
    if node.op_type == "Gather" and node.domain == "" and _attr(node, "axis", 0) == 0:
        return node.input[1]
    return None


def _token_wise(g: _Graph, node) -> tuple[list[str], int, dict] | None:
    """The unpadded inputs, rank and changed attributes if ``node`` can run on the real tokens only."""
    if node.domain not in ("", "com.microsoft"):
        return None
    op = node.op_type
    if op in ("MatMul", "FusedMatMul"):
        return _matmul(g, node)
    region_in = [i for i in node.input if i in g.region]
    if not region_in:
        return None
    ranks = {g.region[i] for i in region_in}
    if len(ranks) != 1:
        return None
    r = ranks.pop()
    first = [g.unpadded_name(node.input[0])] if node.input[0] in g.region else None
    if op in _LAST_AXIS:
        axis = _attr(node, "axis", -1)
        if first is None or 0 <= axis < 2 or any(i in g.region for i in node.input[1:]):
            return None
        return first + list(node.input[1:]), r, {"axis": axis - 1} if axis >= 2 else {}
    if op in _REDUCE:
        axes = _attr(node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = g.constants.get(node.input[1])
            axes = None if axes is None else list(axes.reshape(-1))
        if first is None or not axes or any(a >= 0 for a in axes) or not _attr(node, "keepdims", 1):
            return None  # only reductions over trailing axes counted from the end, keeping the rank
        return first + list(node.input[1:]), r, {}
    if op not in _ELEMENTWISE:
        return None
    inputs = []
    for i in node.input:
        rank = g.rank.get(i)
        if i in g.region:
            inputs.append(g.unpadded_name(i))
        elif not i or rank is not None and rank <= r - 2:
            inputs.append(i)  # absent, or broadcast over the trailing axes only
        elif rank == r and g.aligned(i):
            inputs.append(None)  # token-aligned: unpadded once the node is accepted
        else:
            return None
    return [i if i is not None else g.unpad(orig) for i, orig in zip(inputs, node.input)], r, {}


def _matmul(g: _Graph, node) -> tuple[list[str], int, dict] | None:
    x, weight = node.input[0], node.input[1]
    if weight in g.region or g.rank.get(weight) != 2:
        return None
    if node.op_type == "FusedMatMul" and any(_attr(node, a, 0) for a in ("transA", "transBatchA", "transBatchB")):
        return None
    if x in g.region:
        return [g.unpadded_name(x), weight], g.region[x], {}
    if g.rank.get(x) == 3 and g.aligned(x, exact=True):  # e.g. attention's context, back in [B, S, H]
        return [g.unpad(x), weight], 3, {}
    return None


def eliminate_padding(model: onnx.ModelProto, ids: str = "input_ids", mask: str = "attention_mask"):
    """Rewrite ``model`` (ORT's exported forward graph) to run its token-wise nodes on the tokens
    ``mask`` keeps. Returns ``(model, Rewrite)``, or ``(model, None)`` unchanged when the graph has
    no ``ids`` embedding or no ``mask`` input."""
    inputs = {i.name for i in model.graph.input}
    if ids not in inputs or mask not in inputs:
        return model, None
    if not any(_embedding_indices(n) == ids for n in model.graph.node):
        return model, None
    model = _copy(model)
    g = _Graph(model, ids, mask)
    for node in model.graph.node:
        if _embedding_indices(node) == ids:
            g.emit_unpadded(node, [node.input[0], g.unpad(ids), *node.input[2:]], g.rank.get(ids, 2) + 1)
            continue
        if node.op_type == "Shape" and node.input[0] in g.region and not node.attribute:
            trail = g.name("trail")
            g.nodes += [
                helper.make_node("Shape", [g.unpadded_name(node.input[0])], [trail], start=1),
                helper.make_node("Concat", [_PREFIX + "bs", trail], [node.output[0]], axis=0),
            ]
            continue
        accepted = _token_wise(g, node)
        if accepted is not None:
            g.emit_unpadded(node, accepted[0], accepted[1], **accepted[2])
            continue
        for i in node.input:
            if i in g.region:
                g.pad(i)
        g.append(node)
    for out in model.graph.output:
        if out.name in g.region:
            g.pad(out.name)
    nodes = [_copy(n) for n in g.nodes]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    for v in list(model.graph.value_info):  # ORT cannot infer the types ATen's outputs have
        if v.name in g.twins:
            twin = model.graph.value_info.add()
            twin.CopyFrom(v)
            twin.name = g.twins[v.name]
            if twin.type.tensor_type.HasField("shape"):
                dims = twin.type.tensor_type.shape.dim
                del dims[:2]
                dims.insert(0, onnx.TensorShapeProto.Dimension(dim_param="unpadded_tokens"))
    model.graph.value_info.extend(helper.make_tensor_value_info(n, t, None) for n, t in g.typed.items())
    return model, g.stats


def _copy(proto):
    new = type(proto)()
    new.CopyFrom(proto)
    return new
