"""A linear layer's forward product ``X W^T`` and its input's gradient ``dY W`` computed by PyTorch's
matrix product instead of ORT's ``MatMul`` and ``FusedMatMul`` (MLAS), on the CPUs where PyTorch's
(MKL) was measured faster at the layers' shapes: Intel's.

``scripts/weight_grad_microbench.py --products forward-and-input-grad`` timed both products at the
bench models' layer shapes (``docs/results/kernel-profiles/<cpu>/forward-and-input-grad.json``):

- On a 2-core Intel Xeon (AVX512) ``mm`` took less time for the input gradient at every shape
  (LoRA 200M's 512 x 1024 x 1024: 6.2 against 9.4 ms; 2,048 x 3,072 x 768: 39.5 against 63.4) and
  for the forward product at all but one (6.9 against 9.9 ms; 37.0 against 46.3); at the hidden-256
  Llama's 688 x 256 feed-forward weight ORT's forward took 3.2 ms against 5.8.
- On a 2-core AMD EPYC (AVX2) ORT's is as fast or faster at every layer shape (8.5 against 8.5 ms
  at 512 x 1024 x 1024; 70.8 against 82.1 at 2,048 x 3,072 x 768) but one input gradient (2,048 x
  1,024 x 384: 20.3 against 13.8 ms): the products stay ORT's there.

In training, ``scripts/paired_option_steps.py --workload <w> --option cpu_linear_product_swap`` (one
process, the option's two sides' ``train()`` calls alternating: this VM's speed drifts too much
between processes) on the 2-core Intel Xeon, every weight of at least 128 x 128 moved, tree 7700976,
the median step with them moved against without (raw results: ``docs/results/linear-products/<cpu>/``):
LoRA 200M (hidden 1,024) 2914 against 3269 ms, LoRA 485M (1,536) 7232 against 8445, BERT-base (768)
3040 against 3367; MiniLM (384) 1948 against 1964 on MLM and 418 against 432 on SST-2, the
hidden-256 Llama 1114 against 1079, LoRA 55M (512) 652 against 588. The bench's GPT-2 shape, where
nothing moved at that tree (its ``Conv1D`` layers were not taken yet; the head is in the fused loss),
gave 1644 against 1577: the method's own spread. Hence the default bound,
``options.LINEAR_PRODUCT_MIN_DIM`` (768). A distilgpt2-shaped model (6 x 768, batch 4 x 256, tree
29360f9, its ``Conv1D`` layers taken at the default bound): 3861 against 4900 ms.

In ORT's training graph an ``nn.Linear`` weight ``W`` (out x in, a graph input) is read through one
``Transpose`` (perm [1, 0]); its forward product is ``MatMul(X, W^T)`` and its input's gradient
``FusedMatMul(dY, W^T, transB=1)`` (``Gemm`` for 2-D operands). Each becomes one ORT ``ATen`` node
running ``ort_hf::linear_forward`` (``matmul(X, W.t())``, eager's ``linear`` without its bias) or
``ort_hf::linear_input_grad`` (``matmul(dY, W)``, ``csrc/cpu_linear_product.cpp``) with PyTorch's
thread count outside ORT's graph for its duration; the ``Transpose`` goes once nothing else reads it.
A ``Conv1D`` weight (GPT-2's layers, in x out, read as it is) gives ``Gemm(X, W, b)`` forward and
``Gemm(dY, W, transB=1)`` (``FusedMatMul`` for more than 2-D) for its input's gradient:
``ort_hf::conv1d_forward`` (``addmm(b, X, W)``, as ``Conv1D.forward`` calls it) and
``ort_hf::conv1d_input_grad`` (``matmul(dY, W.t())``).
Only a float32 weight of at least ``ORTOptions.cpu_linear_product_min_dim`` rows and columns, and
a ``FusedMatMul`` or ``Gemm`` with ``alpha`` and ``beta`` 1 and no other transposition. Behind
``ORTOptions.cpu_linear_product_swap``; not with ORT's recompute on (``swap_switches.wanted_swaps``).
The same switch moves a head's weight gradient over the rows label sparsity kept
(``cpu_weight_grad.py``).
"""

from __future__ import annotations

from onnx import GraphProto, TensorProto, helper

from .._onnx_graph import readers_of, rebuild_nodes, set_elem_types
from . import cpu_head_products
from .cpu_weight_grad import large_enough, threads_constant
from .options import LINEAR_PRODUCT_MIN_DIM

FORWARD = "ort_hf::linear_forward"
INPUT_GRAD = "ort_hf::linear_input_grad"
CONV1D_FORWARD = "ort_hf::conv1d_forward"
CONV1D_INPUT_GRAD = "ort_hf::conv1d_input_grad"
# operator -> its name among the swapped kernels (the first step's log line, the sweep's tables)
KEYS = {
    FORWARD: "MatMul (linear forward)",
    INPUT_GRAD: "MatMul (linear input gradient)",
    CONV1D_FORWARD: "Gemm (Conv1D forward)",
    CONV1D_INPUT_GRAD: "MatMul (Conv1D input gradient)",
}
# /proc/cpuinfo's vendor_id of the CPUs where PyTorch's products were measured faster (the docstring)
TORCH_PRODUCT_VENDORS = frozenset({"GenuineIntel"})


def linear_products_wanted(asked: bool | None, vendor: str | None = None) -> bool:
    """Whether the layers' forward products and input gradients move: as ``asked``
    (``ORTOptions.cpu_linear_product_swap``), else on the CPUs of :data:`TORCH_PRODUCT_VENDORS` only."""
    return cpu_head_products.as_asked_or_on(asked, TORCH_PRODUCT_VENDORS, vendor)


def _weights(graph: GraphProto, min_dim: int) -> set[str]:
    """The large enough float32 2-D weights (graph inputs or initializers)."""
    weights = {
        v.name
        for v in graph.input
        if v.type.tensor_type.elem_type == TensorProto.FLOAT
        and len(dims := [d.dim_value for d in v.type.tensor_type.shape.dim]) == 2
        and large_enough(*dims, min_dim)
    }
    return weights | {
        t.name
        for t in graph.initializer
        if t.data_type == TensorProto.FLOAT and len(t.dims) == 2 and large_enough(*t.dims, min_dim)
    }


def _transposed(graph: GraphProto, weights: set[str]) -> dict[str, str]:
    """``Transpose`` output -> the weight it transposes with perm [1, 0]."""
    return {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Transpose"
        and node.domain in ("", "ai.onnx")
        and node.input[0] in weights
        and [list(a.ints) for a in node.attribute if a.name == "perm"] == [[1, 0]]
    }


def _product(node, transposed: dict[str, str], weights: set[str]) -> tuple[str, list[str]] | None:
    """``(operator, inputs)`` where ``node`` is one of the module docstring's products, else None."""
    if len(node.input) < 2 or node.input[0] in transposed or node.input[0] in weights:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    plain = float(attrs.get("alpha", 1.0)) == 1.0 and attrs.get("transA", 0) == 0
    gemm = node.op_type == "Gemm" and node.domain in ("", "ai.onnx")
    fused = node.op_type == "FusedMatMul" and node.domain == "com.microsoft"
    if fused:
        plain = plain and attrs.get("transBatchA", 0) == 0 and attrs.get("transBatchB", 0) == 0
    if node.input[1] in transposed and len(node.input) == 2:  # nn.Linear's
        weight = transposed[node.input[1]]
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
            return FORWARD, [node.input[0], weight]
        if (gemm or fused) and plain and attrs.get("transB", 0) == 1:
            return INPUT_GRAD, [node.input[0], weight]
    elif node.input[1] in weights and plain:  # Conv1D's (in x out, read as it is)
        if gemm and len(node.input) == 3 and float(attrs.get("beta", 1.0)) == 1.0 and attrs.get("transB", 0) == 0:
            return CONV1D_FORWARD, list(node.input)
        if (gemm or fused) and len(node.input) == 2 and attrs.get("transB", 0) == 1:
            return CONV1D_INPUT_GRAD, list(node.input)
    return None


def swap_linear_products(graph: GraphProto, threads: int, min_dim: int = LINEAR_PRODUCT_MIN_DIM) -> dict[str, int]:
    """Rewrite ``graph`` in place (see the module docstring); returns how many products moved, by
    :data:`KEYS`' name. ``threads``: PyTorch's thread count for the products; ``min_dim``:
    ``large_enough``'s."""
    weights = _weights(graph, min_dim)
    if not weights:
        return {}
    transposed = _transposed(graph, weights)
    original = list(graph.node)  # held: a node's id() stays its own while the list lives
    replaced: dict[int, object] = {}
    moved: dict[str, int] = {}
    threads_name = f"ort_hf/linear_product_threads_{threads}"
    for node in original:
        found = _product(node, transposed, weights)
        if found is None:
            continue
        operator, inputs = found
        replaced[id(node)] = helper.make_node(
            "ATen",
            [*inputs, threads_name],
            [node.output[0]],
            name=f"{node.name or node.output[0]}/{operator.replace('::', '_')}",
            domain="org.pytorch.aten",
            operator=operator,
            overload_name="",
        )
        moved[KEYS[operator]] = moved.get(KEYS[operator], 0) + 1
    if not replaced:
        return {}
    outputs = {out.name for out in graph.output}
    readers = readers_of(node for node in original if id(node) not in replaced)
    dropped = {
        id(node)
        for node in original
        if node.op_type == "Transpose"
        and node.output[0] in transposed
        and node.output[0] not in outputs
        and not readers.get(node.output[0])
    }
    rebuild_nodes(graph, original, replaced, dropped, first=[threads_constant(threads_name, threads)])
    set_elem_types(graph, {node.output[0]: TensorProto.FLOAT for node in replaced.values()})
    return moved
