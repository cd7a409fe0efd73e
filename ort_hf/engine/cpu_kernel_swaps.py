"""ORT 1.19.2's CPU training kernels swapped, in the built training graph, for faster ones
computing the same values, or (``ConvGrad``) for a form of the same kernel that is correct.

The rewrite runs through ORT's own hook for optimising the built training graph
(``GraphOptimizerRegistry``: after the gradient graph, label sparsity and ORT's fusions), for a
model ort_hf wrapped whose parameters are on the CPU when the graph is built (``placement.py``;
ORT's own idea of the device can be stale). Each speed swap has its ``ORTOptions`` switch
(``swap_switches.py``); the two corrections have none. A node it cannot translate exactly is left to ORT.

- ``SoftmaxCrossEntropyLossInternal`` (behind ``nn.CrossEntropyLoss``) computes its log-softmax
  serially: on the MLM benchmark (331 labelled rows x 30,522 classes) the costliest node of ORT's
  per-node profile (``--ort_profile_dir``). ONNX ``LogSoftmax`` (MLAS: vectorised, over the
  intra-op threads) then ``NegativeLogLikelihoodLoss`` give its two outputs: the log-probabilities its gradient
  node reads, and the loss, with the same reduction, class weights and ignored
  label. Only float32 scores and loss, and a constant label to ignore.
- Its gradient, ``SoftmaxCrossEntropyLossInternalGrad``, is one serial loop too, a ``std::exp`` an
  element: 77 ms at those 331 x 30,522, 248 ms at 1,024 x 32,000, against 5.4 and 19.3 ms for
  ort_hf's ``softmax_cross_entropy_grad`` (``csrc/cpu_cross_entropy_grad.cpp``: the same values, the
  exponential vectorised, on PyTorch's threads, into a kept buffer), fastest of 60 calls on the
  2-core Intel Xeon (``scripts/kernel_microbench.py``;
  ``docs/results/kernel-profiles/intel-xeon-avx512-2cpu/microbench.json``). Under the same switch,
  for float32 and a constant label to ignore, as above; 2-D or (N, C, d...) scores.
- ``BiasGeluGrad_dX`` (the gradient of BERT-style feed-forward GELU, exact erf form) is a slower
  loop than PyTorch's vectorised ``gelu_backward``; it becomes ONNX ``Add`` (X + B) then an ORT
  ``ATen`` node calling ``aten::gelu_backward`` (``approximate`` left at its default, 'none'). Only
  float32.
- ``FastGeluGrad`` and ``BiasFastGeluGrad_dX`` (the gradient of the tanh-approximated GELU that ORT
  runs as ``FastGelu``: GPT-2's ``gelu_new``, ``gelu_pytorch_tanh``) are a serial loop too, 7.7% of
  ORT's node time on the ``clm-gpt2`` bench workload against 0.3% for the forward; they become
  (``Add`` X + B, then) ort_hf's ``gelu_tanh_backward`` (``csrc/cpu_gelu_tanh_grad.cpp``: PyTorch's
  ``gelu_backward`` with ``approximate='tanh'``, which ORT's ATen node cannot pass as a string).
  Only float32.
- ``LayerNormalizationGrad``, ``SimplifiedLayerNormalizationGrad`` (RMSNorm), ``SoftmaxGrad_13`` and
  ``ReluGrad`` run on PyTorch's kernels or ort_hf's (``cpu_grad_swaps.py`` has them and their
  figures).
- The ``Gemm`` and ``Transpose`` that give a linear weight's gradient run as PyTorch's
  matrix product (``cpu_weight_grad.py`` has why and its figures); it runs first, so that the
  ``Gemm`` correction below does not take that Gemm.
- On Intel CPUs, a linear layer's forward product and its input's gradient run as PyTorch's matrix
  product too (``cpu_linear_products.py`` has why, where and its figures), also before the ``Gemm``
  correction.
- ``Dropout`` draws its mask serially (one ``minstd_rand0`` draw an element) and ``DropoutGrad``
  is one serial pass. Both become ORT ``ATen`` nodes running ort_hf's kernels
  (``csrc/cpu_dropout.cpp``, through torch's dispatcher), with the same contract; the mask
  travels as uint8 instead of bool, since ORT 1.19.2 reads no bool back from PyTorch
  (``dlpack_converter.cc``). Only float32, a constant ratio in (0, 1), training mode on, and a
  mask read by ``DropoutGrad`` nodes alone; not when ``ORTOptions.cpu_dropout_kernels`` is off
  (recompute turns it off: ``wanted_swaps``). docs/dropout.md has the rest.
- ``aten::embedding_backward`` (ORT's ATen node for an embedding's gradient) allocates its dense,
  vocabulary-sized gradient anew every step; ort_hf's ``embedding_dense_grad``
  (``csrc/cpu_embedding_grad.cpp``, where the cost is explained) writes the same sums into a
  buffer it keeps once the previous step's gradient has been released. It falls back to
  ``aten::embedding_backward`` for anything but a dense float32 gradient. A table tied to a head
  whose weight gradient is PyTorch's product gets its rows added into that gradient in place
  instead (``cpu_tied_embedding_grad.py``, run after these swaps).
- ``GatherGrad`` of label sparsity's ``ShrunkenGather`` (the labelled rows, taken before an MLM's
  head) becomes ``aten::embedding_backward`` into as many rows: the indices are distinct, so each
  row of the result is a row of the gradient or zeros, ORT's values bit for bit. ORT's kernel took
  16 to 19 ms a call for 288 to 347 rows of 384 into 2,048 (ORT's profile of the MLM workload on a
  2-core Intel Xeon); in training, the median step was 1152 ms with the swap against 1180 without
  (``scripts/paired_option_steps.py --workload mlm --option cpu_gather_grad_swap``,
  ``docs/results/mlm-label-rows/``). Only float32 and axis 0; behind ``ORTOptions.cpu_gather_grad_swap``.
- ``ConvGrad`` of a grouped convolution whose kernel is not 2-D writes past the end of its ``dX``
  output: before each group's col2im it zeroes a whole image (``C * input_image_size``
  elements, conv_grad.cc's ``Col2imNdPar`` call) from that group's offset, so the last image's
  groups zero up to ``(group - 1) / group`` of an image beyond the buffer, into whatever ORT
  placed there: other gradients, stashed activations, the heap's own records (wrong gradients,
  non-finite losses, ``malloc`` aborts). Its 2-D path clears one group's channels only. A 1-D
  ``ConvGrad`` (depthwise ``Conv1d``: ConvBERT, SqueezeBERT, wav2vec2's positional convolution)
  becomes the 2-D one over ``[N, C, 1, L]``, its inputs unsqueezed and its gradients squeezed
  back; a grouped 3-D one is refused (no exact 2-D form), failing the build instead of memory.
  Any ``ConvGrad`` with a ``SAME_*`` ``auto_pad`` is refused too: the CPU kernel reads ``pads``
  only, so its gradients would be those of an unpadded convolution. ort_hf's own export writes
  explicit pads (``symbolics/conv_padding.py``); this catches a graph that reached ORT otherwise.
- ``Gemm`` without a ``C`` input (what ORT's gradient of a 2-D ``MatMul`` emits: a weight's gradient
  ``X^T dY``, summed over the rows) fails on CPU when that sum is over no rows
  (``gemm_helper.h:59 ... K_ > 0``), where torch returns zeros: a mixture-of-experts layer whose
  expert got no token in the batch (JetMoE) stops training. ``FusedMatMul`` runs the same MLAS
  sgemm (bit-equal outputs, the same time on 2k-4k x 256-3072 operands) and accepts an empty sum,
  but leaves its output unwritten then (whatever the buffer held, NaN included): a ``Where`` on the
  sum's length gives zeros there. Only float32.
"""

from __future__ import annotations

import math

from onnx import GraphProto, TensorProto, helper, numpy_helper

from .._onnx_graph import readers_of, set_elem_types
from .cpu_grad_swaps import layer_norm_grad, relu_grad, rms_norm_grad, softmax_grad
from .cpu_linear_products import swap_linear_products
from .cpu_tied_embedding_grad import add_tied_embedding_grads
from .cpu_weight_grad import swap_weight_grads
from .export_record import ACTIVE_EXPORT_RECORD
from .swap_switches import ALL_SWAPS
from .symbolics.flash_attention import name_unneeded_gradients, use_own_kernel

_MS = "com.microsoft"
_ATEN = "org.pytorch.aten"


def _scalar_constants(graph: GraphProto) -> dict[str, int | float | bool]:
    """One-element constants of ``graph`` by name (initializers and Constant nodes), as Python
    ints, floats and bools."""
    tensors = [(init.name, init) for init in graph.initializer]
    tensors += [
        (node.output[0], node.attribute[0].t)
        for node in graph.node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"
    ]
    values = {}
    for name, tensor in tensors:
        if math.prod(tensor.dims) == 1:  # read no larger tensor's data
            array = numpy_helper.to_array(tensor)
            if array.dtype.kind in "iufb":
                values[name] = array.reshape(()).item()
    return values


def _int_constant(constants: dict, name: str) -> int | None:
    value = constants.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Context:
    """What the per-node swaps read from the whole graph, and what they add to it."""

    def __init__(self, graph: GraphProto, swaps: frozenset[str], threads: int):
        self.threads = threads  # PyTorch's count outside ORT's graph, for the kernels that take one
        self.constants = _scalar_constants(graph)
        self.types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
        # Dropout's output 0 -> (mask, ratio); none when the model is not to use our kernels.
        wanted = "dropout" in swaps and _own_kernel("cpu_dropout")
        self.dropout_masks = _swappable_dropouts(graph, self.constants, self.types) if wanted else {}
        self.mask_ratios = dict(self.dropout_masks.values())
        self.own_embedding_grad = "embedding_grad" in swaps and _own_kernel("embedding_dense_grad")
        self.weight_lookups = _weight_lookups(graph) if self.own_embedding_grad else set()
        self.labelled_rows = _labelled_row_indices(graph) if "gather_grad" in swaps else set()
        self.ranks = (  # read by the gather-gradient swap alone
            {
                v.name: len(v.type.tensor_type.shape.dim)
                for v in (*graph.value_info, *graph.input, *graph.output)
                if v.type.tensor_type.HasField("shape")
            }
            if self.labelled_rows
            else {}
        )
        self.own_gelu_tanh_grad = "gelu_grad" in swaps and _own_kernel("gelu_tanh_backward")
        self.own_rms_norm_grad = "norm_grad" in swaps and _own_kernel("rms_norm_backward")
        self.own_softmax_grad = "softmax_grad" in swaps and _own_kernel("softmax_backward")
        self.own_relu_grad = "relu_grad" in swaps and _own_kernel("relu_backward")
        self.own_cross_entropy_grad = "cross_entropy" in swaps and _own_kernel("softmax_cross_entropy_grad")
        self.new_nodes: list = []  # constants the swapped nodes read
        self.new_types: dict[str, int] = {}  # output types ORT cannot infer for ATen nodes
        self._ratio_names: dict[float, str] = {}
        self._axis_name: str | None = None
        self._constants: set[str] = set()

    def ratio(self, value: float) -> str:
        """A float32 scalar constant holding ``value`` (ATen's ``float`` argument)."""
        if value not in self._ratio_names:
            name = f"ort_hf/dropout_ratio_{len(self._ratio_names)}"
            self.new_nodes.append(
                helper.make_node(
                    "Constant", [], [name], name=name, value=helper.make_tensor(name, TensorProto.FLOAT, [], [value])
                )
            )
            self._ratio_names[value] = name
        return self._ratio_names[value]

    def int64_scalar(self, value: int) -> str:
        """An int64 scalar constant holding ``value``."""
        return self._constant(f"ort_hf/int64_{value}", TensorProto.INT64, value)

    def int64_vector(self, values: tuple[int, ...]) -> str:
        """An int64 1-D constant holding ``values`` (ATen's ``int[]`` and ``bool[]`` arguments)."""
        name = "ort_hf/int64_vector_" + "_".join(map(str, values))
        if name not in self._constants:
            self._constants.add(name)
            self.new_nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [name],
                    name=name,
                    value=helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values)),
                )
            )
        return name

    def bool_false(self) -> str:
        """A bool scalar constant False."""
        return self._constant("ort_hf/bool_false", TensorProto.BOOL, False)

    def float_zero(self) -> str:
        """A float32 scalar constant 0."""
        return self._constant("ort_hf/float_zero", TensorProto.FLOAT, 0.0)

    def _constant(self, name: str, elem_type: int, value) -> str:
        if name not in self._constants:
            self._constants.add(name)
            self.new_nodes.append(
                helper.make_node(
                    "Constant", [], [name], name=name, value=helper.make_tensor(name, elem_type, [], [value])
                )
            )
        return name

    def spatial_axis(self) -> str:
        """An int64 ``[2]`` constant: the axis a 1-D convolution's tensors gain to become 2-D."""
        if self._axis_name is None:
            name = self._axis_name = "ort_hf/conv_grad_axis"
            self.new_nodes.append(
                helper.make_node(
                    "Constant", [], [name], name=name, value=helper.make_tensor(name, TensorProto.INT64, [1], [2])
                )
            )
        return self._axis_name


def _cross_entropy(node, attrs: dict, ctx: _Context) -> list | None:
    inputs = list(node.input) + [""] * (4 - len(node.input))
    scores, labels, weight, ignore = inputs[:4]
    if (
        ctx.types.get(scores) != TensorProto.FLOAT
        or attrs.get("output_type", TensorProto.FLOAT) != TensorProto.FLOAT
        or (ignore and _int_constant(ctx.constants, ignore) is None)
    ):
        return None
    log_prob = node.output[1] if len(node.output) > 1 and node.output[1] else f"{_name(node)}/log_prob"
    nll_attrs = {"reduction": attrs.get("reduction", b"mean").decode()}
    if ignore:
        nll_attrs["ignore_index"] = _int_constant(ctx.constants, ignore)
    # axis 1: the classes of ONNX's cross-entropy, for 2-D scores and for (N, C, d1, ...) alike.
    return [
        helper.make_node("LogSoftmax", [scores], [log_prob], name=f"{_name(node)}/LogSoftmax", axis=1),
        helper.make_node(
            "NegativeLogLikelihoodLoss",
            [log_prob, labels] + ([weight] if weight else []),
            [node.output[0]],
            name=f"{_name(node)}/NegativeLogLikelihoodLoss",
            **nll_attrs,
        ),
    ]


_REDUCTIONS = {b"none": 0, b"mean": 1, b"sum": 2}  # at::Reduction's values


def _cross_entropy_grad(node, attrs: dict, ctx: _Context) -> list | None:
    inputs = list(node.input) + [""] * (5 - len(node.input))
    dy, log_prob, labels, weight, ignore = inputs[:5]
    reduction = _REDUCTIONS.get(attrs.get("reduction", b"mean"))
    if (
        not ctx.own_cross_entropy_grad
        or len(node.input) > 5
        or reduction is None
        or ctx.types.get(dy) != TensorProto.FLOAT
        or attrs.get("output_type", TensorProto.FLOAT) != TensorProto.FLOAT
        or not ignore  # without it, ORT's kernel falls back on an attribute's default: leave that to it
        or _int_constant(ctx.constants, ignore) is None
    ):
        return None
    ctx.new_types[node.output[0]] = TensorProto.FLOAT
    return [
        helper.make_node(
            "ATen",
            [
                dy,
                log_prob,
                labels,
                weight,
                ctx.int64_scalar(_int_constant(ctx.constants, ignore)),
                ctx.int64_scalar(reduction),
                ctx.int64_scalar(ctx.threads),
            ],
            [node.output[0]],
            name=f"{_name(node)}/ort_hf_softmax_cross_entropy_grad",
            domain=_ATEN,
            operator="ort_hf::softmax_cross_entropy_grad",
            overload_name="",
        )
    ]


def _name(node) -> str:
    """A prefix for a replacement's node names, unique in the graph even if ``node`` has no name."""
    return node.name or node.output[0]


def _is_true(constants: dict, name: str) -> bool:
    return constants.get(name) is True


def _swappable_dropouts(graph: GraphProto, constants: dict, types: dict) -> dict[str, tuple[str, float]]:
    """The ``Dropout`` nodes whose pair can run on our kernels, by their output 0: (mask name,
    ratio). Each has float32 data, a constant ratio in (0, 1) (at 0 it keeps ORT's
    node and draws nothing), training mode constantly on, and a mask that only ``DropoutGrad``
    nodes of the same ratio and in training mode read (not a graph output: its type changes)."""
    readers = readers_of(graph.node)
    graph_outputs = {out.name for out in graph.output}
    swappable = {}
    for node in graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
            continue
        x, ratio_name, mode = (list(node.input) + ["", ""])[:3]
        ratio = constants.get(ratio_name) if ratio_name else 0.5
        if (
            types.get(x) != TensorProto.FLOAT
            or not isinstance(ratio, float)
            or not 0.0 < ratio < 1.0
            or not _is_true(constants, mode)
        ):
            continue
        mask = node.output[1] if len(node.output) > 1 and node.output[1] else f"{node.output[0]}/ort_hf_mask"
        if mask in graph_outputs or not all(
            _reads_as_gradient(reader, mask, ratio, constants) for reader in readers.get(mask, [])
        ):
            continue
        swappable[node.output[0]] = (mask, ratio)
    return swappable


def _reads_as_gradient(node, mask: str, ratio: float, constants: dict) -> bool:
    inputs = list(node.input) + [""] * (4 - len(node.input))
    return (
        node.op_type == "DropoutGrad"
        and node.domain == _MS
        and inputs[1] == mask
        and inputs.count(mask) == 1
        and constants.get(inputs[2]) == ratio
        and _is_true(constants, inputs[3])
    )


def _dropout(node, attrs: dict, ctx: _Context) -> list | None:
    if node.output[0] not in ctx.dropout_masks:
        return None
    mask, ratio = ctx.dropout_masks[node.output[0]]
    ctx.new_types.update({node.output[0]: TensorProto.FLOAT, mask: TensorProto.UINT8})
    return [
        helper.make_node(
            "ATen",
            [node.input[0], ctx.ratio(ratio)],
            [node.output[0], mask],
            name=f"{_name(node)}/ort_hf_cpu_dropout",
            domain=_ATEN,
            operator="ort_hf::cpu_dropout",
            overload_name="",
        )
    ]


def _dropout_grad(node, attrs: dict, ctx: _Context) -> list | None:
    mask = node.input[1] if len(node.input) > 1 else ""
    if mask not in ctx.mask_ratios:
        return None
    ctx.new_types[node.output[0]] = TensorProto.FLOAT
    return [
        helper.make_node(
            "ATen",
            [node.input[0], mask, ctx.ratio(ctx.mask_ratios[mask])],
            [node.output[0]],
            name=f"{_name(node)}/ort_hf_cpu_dropout_grad",
            domain=_ATEN,
            operator="ort_hf::cpu_dropout_grad",
            overload_name="",
        )
    ]


def _bias_gelu_grad(node, attrs: dict, ctx: _Context) -> list | None:
    # dY, X and B share one type; X is often an ORT-inserted value without recorded type.
    if len(node.input) != 3 or ctx.types.get(node.input[0]) != TensorProto.FLOAT:
        return None
    dy, x, bias = node.input
    pre = f"{_name(node)}/gelu_input"
    ctx.new_types[node.output[0]] = TensorProto.FLOAT
    return [
        helper.make_node("Add", [x, bias], [pre], name=f"{_name(node)}/Add"),
        helper.make_node(
            "ATen",
            [dy, pre, ""],
            [node.output[0]],
            name=f"{_name(node)}/gelu_backward",
            domain=_ATEN,
            operator="gelu_backward",
            overload_name="",
        ),
    ]


def _fast_gelu_grad(node, attrs: dict, ctx: _Context) -> list | None:
    # FastGeluGrad(dY, X), or BiasFastGeluGrad_dX(dY, X, B) once ORT fused the bias Add into FastGelu.
    if not ctx.own_gelu_tanh_grad or len(node.input) not in (2, 3) or ctx.types.get(node.input[0]) != TensorProto.FLOAT:
        return None
    nodes, x = [], node.input[1]
    if len(node.input) == 3:
        x = f"{_name(node)}/gelu_input"
        nodes.append(helper.make_node("Add", [node.input[1], node.input[2]], [x], name=f"{_name(node)}/Add"))
    ctx.new_types[node.output[0]] = TensorProto.FLOAT
    return nodes + [
        helper.make_node(
            "ATen",
            [node.input[0], x],
            [node.output[0]],
            name=f"{_name(node)}/ort_hf_gelu_tanh_backward",
            domain=_ATEN,
            operator="ort_hf::gelu_tanh_backward",
            overload_name="",
        )
    ]


def _weight_lookups(graph: GraphProto) -> set[str]:
    """The indices of the graph's ATen ``embedding`` lookups into a weight (a graph input or
    initializer, not a tensor the graph computes).

    Only their gradients go to ort_hf's kernel: its buffers pay off for a table whose size never
    changes. Padding elimination's row gathers are ATen embeddings too, into activations whose row
    count changes every batch; kept buffers for those would be evicted and re-faulted in turn, the
    vocabulary-sized one with them."""
    produced = {out for node in graph.node for out in node.output}
    return {
        node.input[1]
        for node in graph.node
        if node.op_type == "ATen"
        and node.domain == _ATEN
        and len(node.input) > 1
        and any(a.name == "operator" and a.s == b"embedding" for a in node.attribute)
        and node.input[0] not in produced
    }


def _embedding_grad(node, attrs: dict, ctx: _Context) -> list | None:
    if (
        attrs.get("operator") != b"embedding_backward"
        or not ctx.own_embedding_grad
        or node.input[1] not in ctx.weight_lookups
    ):
        return None
    swapped = helper.make_node(
        "ATen",
        list(node.input),
        list(node.output),
        name=f"{_name(node)}/ort_hf_embedding_grad",
        domain=_ATEN,
        operator="ort_hf::embedding_dense_grad",
        overload_name="",
    )
    if node.output[0] not in ctx.types and ctx.types.get(node.input[0]):  # the output's type is the gradient's
        ctx.new_types[node.output[0]] = ctx.types[node.input[0]]
    return [swapped]


def _labelled_row_indices(graph: GraphProto) -> set[str]:
    """The indices of the rows ORT's label sparsity keeps: those its ``ShrunkenGather`` nodes (axis 0)
    take, the positions of the labels not ignored (``NonZero``'s output: distinct, in order)."""
    return {
        node.input[1]
        for node in graph.node
        if node.op_type == "ShrunkenGather"
        and len(node.input) == 2
        and all(a.i == 0 for a in node.attribute if a.name == "axis")
    }


def _gather_grad(node, attrs: dict, ctx: _Context) -> list | None:
    # GatherGrad(shape, indices, dY) -> zeros(shape) with dY's rows added at the indices (axis 0):
    # aten::embedding_backward into shape[0] rows, for label sparsity's indices (module docstring).
    if (
        len(node.input) != 3
        or attrs.get("axis", 0) != 0
        or node.input[1] not in ctx.labelled_rows
        or ctx.types.get(node.input[2]) != TensorProto.FLOAT
        or ctx.ranks.get(node.input[2]) != 2
        or ctx.ranks.get(node.input[1], 1) != 1  # ORT's Squeeze of NonZero's [1, n]: often undeclared
    ):
        return None
    shape, indices, dy = node.input
    rows = f"{_name(node)}/rows"
    ctx.new_types[node.output[0]] = TensorProto.FLOAT
    return [
        helper.make_node("Gather", [shape, ctx.int64_scalar(0)], [rows], name=f"{_name(node)}/Rows", axis=0),
        helper.make_node(
            "ATen",
            [dy, indices, rows, ctx.int64_scalar(-1), ctx.bool_false(), ctx.bool_false()],
            list(node.output),
            name=f"{_name(node)}/embedding_backward",
            domain=_ATEN,
            operator="embedding_backward",
            overload_name="",
        ),
    ]


def _conv_grad(node, attrs: dict, ctx: _Context) -> list | None:
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
        raise NotImplementedError(
            f"{_name(node)}: ORT 1.19.2's CPU ConvGrad ignores auto_pad={attrs['auto_pad'].decode()} and would "
            "compute an unpadded convolution's gradients; export the convolution with explicit pads "
            "(ort_hf's _convolution_mode symbolic does) or train it with PyTorch (ort_fallback='auto')"
        )
    group = attrs.get("group", 1)
    if group == 1 or not node.output or not node.output[0]:
        return None  # one group clears the whole image, which is all of it; without dX, no col2im
    spatial = _conv_rank(attrs)
    if spatial == 2:
        return None
    if spatial != 1:
        raise NotImplementedError(
            f"{_name(node)}: the gradient of a grouped convolution with a {spatial or 'unknown'}-D kernel runs on ORT "
            "1.19.2's CPU ConvGrad, which writes past its output (engine/cpu_kernel_swaps.py); train this model "
            "with PyTorch (ort_fallback='auto' does it) or without groups."
        )
    axis, prefix = ctx.spatial_axis(), _name(node)
    nodes = []
    inputs = []
    for i, name in enumerate(node.input[:3]):
        inputs.append(f"{prefix}/2d_input_{i}")
        nodes.append(helper.make_node("Unsqueeze", [name, axis], [inputs[-1]], name=f"{prefix}/Unsqueeze_{i}"))
    outputs = list(node.output)
    squeezed = [(i, name) for i, name in enumerate(outputs[:2]) if name]  # dX, dW; dB is [M] in both forms
    for i, _ in squeezed:
        outputs[i] = f"{prefix}/2d_output_{i}"
    conv_attrs = {k: v for k, v in attrs.items() if k not in ("kernel_shape", "strides", "dilations", "pads")}
    for key, default in (("kernel_shape", None), ("strides", 1), ("dilations", 1)):
        if key in attrs or default is not None:
            conv_attrs[key] = [1, *attrs.get(key, [default])]
    if "pads" in attrs:
        begin, end = attrs["pads"]
        conv_attrs["pads"] = [0, begin, 0, end]
    conv_attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in conv_attrs.items()}
    nodes.append(helper.make_node("ConvGrad", inputs, outputs, name=f"{prefix}/2d", domain=_MS, **conv_attrs))
    nodes += [
        helper.make_node("Squeeze", [outputs[i], axis], [name], name=f"{prefix}/Squeeze_{i}") for i, name in squeezed
    ]
    return nodes


def _conv_rank(attrs: dict) -> int | None:
    """The number of spatial axes of a ConvGrad, from whichever attribute states it."""
    for key, per_axis in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 2)):
        if key in attrs:
            return len(attrs[key]) // per_axis
    return None


def _gemm(node, attrs: dict, ctx: _Context) -> list | None:
    if len([name for name in node.input if name]) != 2 or TensorProto.FLOAT not in (
        ctx.types.get(node.input[0]),
        ctx.types.get(node.input[1]),
    ):
        return None
    # FusedMatMul leaves its output unwritten when the sum is over no rows (values left in the
    # buffer, NaN among them): Where picks zeros then, and FusedMatMul's own values otherwise.
    prefix, trans_a = _name(node), int(attrs.get("transA", 0))
    product, shape, k, nonempty = (f"{prefix}/{part}" for part in ("product", "a_shape", "k", "nonempty"))
    return [
        helper.make_node(
            "FusedMatMul",
            list(node.input[:2]),
            [product],
            name=f"{prefix}/FusedMatMul",
            domain=_MS,
            alpha=float(attrs.get("alpha", 1.0)),
            transA=trans_a,
            transB=int(attrs.get("transB", 0)),
        ),
        helper.make_node("Shape", [node.input[0]], [shape], name=f"{prefix}/Shape"),
        helper.make_node("Gather", [shape, ctx.int64_scalar(0 if trans_a else 1)], [k], name=f"{prefix}/K", axis=0),
        helper.make_node("Greater", [k, ctx.int64_scalar(0)], [nonempty], name=f"{prefix}/NonEmpty"),
        helper.make_node("Where", [nonempty, product, ctx.float_zero()], list(node.output), name=f"{prefix}/Where"),
    ]


# (op type, domain) -> (the swap's name, its rewrite); which run for a model: swap_switches.py.
_SWAPS = {
    ("SoftmaxCrossEntropyLossInternal", _MS): ("cross_entropy", _cross_entropy),
    ("SoftmaxCrossEntropyLossInternalGrad", _MS): ("cross_entropy", _cross_entropy_grad),
    ("BiasGeluGrad_dX", _MS): ("gelu_grad", _bias_gelu_grad),
    ("FastGeluGrad", _MS): ("gelu_grad", _fast_gelu_grad),
    ("BiasFastGeluGrad_dX", _MS): ("gelu_grad", _fast_gelu_grad),
    ("LayerNormalizationGrad", _MS): ("norm_grad", layer_norm_grad),
    ("SimplifiedLayerNormalizationGrad", _MS): ("norm_grad", rms_norm_grad),
    ("SoftmaxGrad_13", _MS): ("softmax_grad", softmax_grad),
    ("ReluGrad", _MS): ("relu_grad", relu_grad),
    ("Dropout", ""): ("dropout", _dropout),
    ("Dropout", "ai.onnx"): ("dropout", _dropout),
    ("DropoutGrad", _MS): ("dropout", _dropout_grad),
    ("ATen", _ATEN): ("embedding_grad", _embedding_grad),
    ("GatherGrad", _MS): ("gather_grad", _gather_grad),
    ("ConvGrad", _MS): ("conv_grad", _conv_grad),
    ("Gemm", ""): ("gemm", _gemm),
    ("Gemm", "ai.onnx"): ("gemm", _gemm),
}


def swap_kernels(graph: GraphProto, swaps: frozenset[str] = ALL_SWAPS, threads: int = 1) -> dict[str, int]:
    """Rewrite ``graph`` in place with the swaps named in ``swaps``; returns how many nodes of each
    type were swapped. ``threads``: PyTorch's thread count for the kernels that take one. The graph's
    opset is ORT's training opset (14 to 20 in ort_hf, ``ORTOptions.opset_version``), where the ONNX
    ops have today's form."""
    if not any(_SWAPS.get((node.op_type, node.domain), ("",))[0] in swaps for node in graph.node):
        return {}
    ctx = _Context(graph, swaps, threads)
    swapped: dict[str, int] = {}
    nodes = []
    for node in graph.node:
        name, swap = _SWAPS.get((node.op_type, node.domain), (None, None))
        replacement = None
        if name in swaps:
            replacement = swap(node, {a.name: helper.get_attribute_value(a) for a in node.attribute}, ctx)
        if replacement is None:
            nodes.append(node)
            continue
        nodes.extend(replacement)
        swapped[node.op_type] = swapped.get(node.op_type, 0) + 1
    if swapped:
        del graph.node[:]
        graph.node.extend(ctx.new_nodes + nodes)
        set_elem_types(graph, ctx.new_types)
    return swapped


def _swap_in_training_graph(graph: GraphProto) -> None:
    """ORT's hook: the swaps of the wrapped model whose graph ORT built (none for a graph of a model
    ort_hf did not wrap, or one whose parameters are not on the CPU, whatever device ORT assumed)."""
    record = ACTIVE_EXPORT_RECORD.get()
    if record is None:
        return
    swapped: dict[str, int] = {}
    if record.device_type == "cpu":
        import torch

        # ORT builds the graph outside its runs, where PyTorch has the process's own thread count.
        threads = torch.get_num_threads()
        name_unneeded_gradients(graph)  # the flash-attention kernel's backward (symbolics/flash_attention.py)
        threaded = use_own_kernel(graph, threads) if _own_kernel("flash_attention") else 0
        if threaded:
            swapped["SDPA (flash attention)"] = threaded
        if "weight_grad" in record.kernel_swaps and _own_kernel("weight_grad"):
            # Before the Gemm correction. A head's gradient over the rows label sparsity kept moves where
            # PyTorch's products are on (cpu_weight_grad.py).
            labelled_too = "linear_product" in record.kernel_swaps
            moved = swap_weight_grads(graph, threads, record.weight_grad_min_dim, labelled_too)
            if moved:
                swapped["Gemm (weight gradient)"] = moved
        if "linear_product" in record.kernel_swaps and _own_kernel("linear_forward"):
            swapped.update(swap_linear_products(graph, threads, record.linear_product_min_dim))
        swapped.update(swap_kernels(graph, record.kernel_swaps, threads))
        if "tied_embedding_grad" in record.kernel_swaps and _own_kernel("embedding_dense_grad_add_"):
            tied = add_tied_embedding_grads(graph)  # after the embedding and weight-gradient swaps it joins
            if tied:
                swapped["Sum (tied embedding gradient)"] = tied
    record.swapped = swapped


def release_kernel_buffers() -> None:
    """Drop the buffers ort_hf's embedding-, softmax-, RMSNorm-, cross-entropy- and weight-gradient
    kernels and its flash-attention wrappers keep for reuse (a model is gone)."""
    import torch

    for release in (
        "release_embedding_grad_buffers",
        "release_softmax_grad_buffers",
        "release_rms_norm_grad_buffers",
        "release_cross_entropy_grad_buffers",
        "release_weight_grad_buffers",
        "release_flash_attention_buffers",
    ):
        if _own_kernel(release):
            getattr(torch.ops.ort_hf, release)()


def _own_kernel(name: str) -> bool:
    """ort_hf's kernel ``name`` is registered with torch (by ``extensions.load_all``)."""
    import torch

    return hasattr(torch.ops.ort_hf, name)


def register() -> None:
    """Enter the rewrite in ORT's registry of training-graph optimisers, for CPU graphs (called
    once per process, by ``runtime.ensure_engine``)."""
    from onnxruntime.training.ortmodule.graph_optimizer_registry import GraphOptimizerRegistry

    GraphOptimizerRegistry.register("all", "cpu", 0, _swap_in_training_graph)
