"""The gradient of a vocabulary-sized linear weight (a causal LM's head, untied or tied to the
embeddings) computed by PyTorch's matrix product instead of ORT's CPU Gemm.

ORT's gradient of ``MatMul(X, Transpose(W))`` (an ``nn.Linear`` weight ``W``, out x in) is
``Gemm(X, dY, transA=1)`` (in x out, summed over the rows) then ``Transpose`` to out x in; ORT's
session fuses the two into one Gemm of ``dY^T X``. For a weight of a vocabulary's rows that one
Gemm is the costliest node of a dense-label causal LM's step after the head's forward: MLAS
runs it at 74-108 GFLOP/s on a 2-core AMD EPYC (AVX2), PyTorch's ``mm`` (MKL) at 89-151, in 1.0x
to 1.8x less time, on the vocabulary-sized shapes of ``scripts/weight_grad_microbench.py`` (its
output: ``docs/results/kernel-profiles/<cpu>/weight-grad.json``). For a layer's own weights (a few
thousand rows at most) that run favours ``mm`` by 1.0x to 1.3x, but an earlier one of the same
shapes favoured ORT on the smaller ones, and routing the layers' linears to PyTorch was no faster in
training ("What we tried", ``docs/benchmarks.md``): those stay ORT's.

The pair becomes one ORT ``ATen`` node running ``ort_hf::weight_grad`` (``csrc/cpu_weight_grad.cpp``:
``mm(dY.t(), X)``, which sums over no rows as zeros) with PyTorch's thread count outside ORT's graph
for its duration. Only a float32 gradient of at least :data:`VOCAB_ROWS` rows, a Gemm without
``C`` and with ``alpha`` 1, read by that Transpose alone. Behind
``ORTOptions.cpu_weight_grad_swap``.

Not in a graph where ORT's label sparsity fired (a ``ShrunkenGather``): there the head's rows are
the labelled positions only, a sum over a few hundred rows, and on the MiniLM MLM workload the swap
made ORT's step 3-5% slower (``ort-hf bench --workloads mlm --variants ort,ort-ort-weight-grad
--rounds 2``, by round: 1971 against 1874 ms, 1865 against 1815 ms; raw results in
``docs/results/mlm-weight-grad/``, whose second eager round ran beside other work and is no
measurement).
"""

from __future__ import annotations

from onnx import GraphProto, TensorProto, helper

from .session_inspection import label_sparsity_in

# Rows of the weights whose gradient moves to PyTorch: a vocabulary, not a layer's width.
VOCAB_ROWS = 8192
OPERATOR = "ort_hf::weight_grad"


def _static_shapes(graph: GraphProto) -> dict[str, tuple[int, list[int]]]:
    """Element type and static dims (0 where unknown) of every value ``graph`` declares."""
    return {
        v.name: (v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
        for v in (*graph.value_info, *graph.output)
    }


def _weight_grad_pair(node, readers: dict, shapes: dict):
    """The Transpose that makes ``node`` (a Gemm) a vocabulary-sized weight's float32 gradient, else None."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if (
        node.op_type != "Gemm"
        or node.domain not in ("", "ai.onnx")
        or len([name for name in node.input if name]) != 2
        or attrs.get("transA", 0) != 1
        or attrs.get("transB", 0) != 0
        or float(attrs.get("alpha", 1.0)) != 1.0
    ):
        return None
    users = readers.get(node.output[0], [])
    if len(users) != 1 or users[0].op_type != "Transpose" or users[0].domain not in ("", "ai.onnx"):
        return None
    transpose = users[0]
    perm = [list(a.ints) for a in transpose.attribute if a.name == "perm"]
    elem_type, dims = shapes.get(transpose.output[0], (0, []))
    if perm != [[1, 0]] or elem_type != TensorProto.FLOAT or len(dims) != 2 or dims[0] < VOCAB_ROWS:
        return None
    return transpose


def swap_weight_grads(graph: GraphProto, threads: int) -> int:
    """Rewrite ``graph`` in place (see the module docstring); returns how many gradients moved.
    ``threads``: PyTorch's thread count for the products."""
    if label_sparsity_in(graph):
        return 0  # label sparsity: the head sums over the labelled rows only (module docstring)
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    shapes = _static_shapes(graph)
    replaced: dict[int, object] = {}
    dropped: set[int] = set()
    threads_name = f"ort_hf/weight_grad_threads_{threads}"
    for node in graph.node:
        transpose = _weight_grad_pair(node, readers, shapes)
        if transpose is None:
            continue
        x, dy = node.input[:2]
        replaced[id(node)] = helper.make_node(
            "ATen",
            [dy, x, threads_name],
            list(transpose.output),
            name=f"{node.name or node.output[0]}/{OPERATOR.replace('::', '_')}",
            domain="org.pytorch.aten",
            operator=OPERATOR,
            overload_name="",
        )
        dropped.add(id(transpose))
    if not replaced:
        return 0
    nodes = [
        helper.make_node(
            "Constant",
            [],
            [threads_name],
            name=threads_name,
            value=helper.make_tensor(threads_name, TensorProto.INT64, [], [threads]),
        )
    ]
    nodes += [replaced.get(id(node), node) for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)
