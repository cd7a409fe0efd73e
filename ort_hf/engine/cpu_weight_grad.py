"""A linear weight's gradient computed by PyTorch's matrix product instead of ORT's CPU Gemm: the
layers' projections and a causal LM's head (untied or tied to the embeddings); where ORT's label
sparsity cut the rows it sums over, only on the CPUs where PyTorch's products are on.

ORT's gradient of ``MatMul(X, Transpose(W))`` (an ``nn.Linear`` weight ``W``, out x in) is
``Gemm(X, dY, transA=1)`` (in x out, summed over the rows) then ``Transpose`` to out x in; ORT's
session fuses the two into one Gemm of ``dY^T X``. A ``Conv1D`` weight (GPT-2's layers: ``X W``, W in
x out) has the Gemm's product itself as its gradient. MLAS runs that Gemm more slowly than PyTorch's
``mm`` (MKL) on a 2-core AMD EPYC (AVX2) (``scripts/weight_grad_microbench.py``; its output:
``docs/results/kernel-profiles/<cpu>/weight-grad.json``): on a vocabulary's rows at 88-100 GFLOP/s
against 104-160, in 1.1x to 1.7x less time; on the layers' shapes of the bench's models and of a
SmolLM-shaped one at 88-126 against 91-155, in 1.1x to 1.6x less time except on the hidden-256
Llama's 688 x 256 feed-forward weight, where ORT's takes 4% less.

On a 2-core AMD EPYC with AVX512 it is the other way round: MLAS ran every shape of that list but
one at 215-392 GFLOP/s against ``mm``'s 162-205, in up to 2x less time (the one, 2048 x 32768 x 512,
at 171 against 185; ``kernel-profiles/amd-epyc-avx512-2cpu/weight-grad.json``). In
training, the swap off against on (``scripts/paired_option_steps.py --workload <w> --option
cpu_weight_grad_swap``, ``docs/results/weight-grad-default/amd-epyc-avx512-2cpu/``), ORT's median
step: BERT-base 1658 to 1285 ms, the MiniLM MLM 779 to 698, the hidden-256 Llama 821 to 736, the
GPT-2 shape 1143 to 1085; LoRA 200M, whose trained weights are all below the size bound, 1302 to
1369 (nothing moves there: noise). So the swap is on by default except on AMD CPUs whose PyTorch
kernels dispatch to AVX512 (:func:`weight_grad_wanted`); Intel's Xeon with AVX512 measured ``mm``
faster (above, and ``kernel-profiles/intel-xeon-avx512-2cpu/``). Those figures are from an EPYC of
/proc/cpuinfo family 26; on one of family 25 with AVX512 the two run at close rates (ORT's 89-173
GFLOP/s, ``mm``'s 97-178; ``kernel-profiles/amd-epyc-avx512-family25-2cpu/``) and ORT's hidden-256
Llama step took 1134 ms with the default against 1180 with the swap on
(``weight-grad-default/amd-epyc-avx512-family25-2cpu/``), so the default stays by vendor and width.

In training, every weight of at least 256 x 256 moved against the head's alone (a bench variant
patched in for the run: ``docs/results/weight-grad-layers/``, its patch and raw results; ``ort-hf
bench --workloads clm,clm-gpt2,sst2-dynamic,bert-base --variants ort,ort-allwg --rounds 2 --steps
10``), ORT's median step: BERT-base 2023 to 1778 ms, the hidden-256 Llama 1812 to 1651, the GPT-2
shape 2820 to 2730 (its head alone: its layers' Conv1D weights did not move then), SST-2 with dynamic
padding 303 to 320 (by round 300 to 309 and 330 to 330). The held-out GPT-2 6 x 384 of
``docs/benchmarks.md``, head and Conv1D weights moved against no swap (``ort-ort-weight-grad``): 4214
to 4047 ms (``docs/results/heldout-gpt2-6x384/``); on the bench's ``clm-gpt2`` (hidden 256) one round
each way, 2525 to 2311 ms and 2455 to 2659 (``docs/results/conv1d-weight-grad/``).
On the SmolLM-shaped model of ``docs/benchmarks.md`` (30 x 576), these bounds against no swap at
all (the ``ort-ort-weight-grad`` variant): 10001 to 9314 ms. On the MiniLM MLM workload, where
label sparsity keeps the head's ORT's, the layers' moved against none (``ort-hf bench --workloads
mlm --variants ort,ort-ort-weight-grad --rounds 2 --steps 10``; ``docs/results/mlm-weight-grad-layers/``):
2019 to 1849 ms. ``mm`` allocates each gradient afresh where ORT's Gemm writes into its arena: the
peak rose from 2585 to 2731 MB on BERT-base and from 5777 to 6032 MB on the SmolLM shape.

The pair (or the Conv1D's Gemm) becomes one ORT ``ATen`` node running ``ort_hf::weight_grad``
(``csrc/cpu_weight_grad.cpp``: ``mm(a.t(), b)``, here ``dY^T X`` or ``X^T dY``, which sums over no rows
as zeros) with PyTorch's thread count outside ORT's graph for its duration. Only a float32 gradient
of at least ``ORTOptions.cpu_weight_grad_min_dim`` rows and columns (``options.WEIGHT_GRAD_MIN_DIM``: not a
LoRA adapter's rank-sized factor, too small a product to gain), a Gemm without ``C`` and with
``alpha`` 1; a Transpose is absorbed where it alone reads the Gemm. Behind
``ORTOptions.cpu_weight_grad_swap``.

A weight whose input rows ORT's label sparsity cut (computed from a ``ShrunkenGather``: the head's,
and the last layer's where the gather moved into it) sums over the labelled positions only, a few
hundred rows. Its gradient moves only where ``ORTOptions.cpu_linear_product_swap`` is on (by
default on Intel CPUs, ``cpu_linear_products.py``). On a 2-core AMD EPYC (AVX2), moving the MiniLM
MLM head's gradient made ORT's step 3-5% slower (``ort-hf bench --workloads mlm --variants
ort,ort-ort-weight-grad --rounds 2`` when the swap took the head alone, by round: 1971 against 1874
ms, 1865 against 1815 ms; raw results in ``docs/results/mlm-weight-grad/``, whose second eager round
ran beside other work and is no measurement). On a 2-core Intel Xeon (AVX512), it is faster: ORT's
``Gemm`` there is followed by a ``Transpose`` and the empty-sum ``Where`` of ``cpu_kernel_swaps``, each
copying the 30,522 x 384 gradient. The median step was 1134 ms with it moved against 1176 without
(``scripts/paired_option_steps.py --workload mlm --option cpu_linear_product_swap``, which moves
nothing else at MiniLM's width; ``docs/results/mlm-label-rows/``). The other layers' weights of such
a graph move on every CPU.
"""

from __future__ import annotations

from onnx import GraphProto, TensorProto, helper

from .._onnx_graph import readers_of, rebuild_nodes
from .options import WEIGHT_GRAD_MIN_DIM

OPERATOR = "ort_hf::weight_grad"


def weight_grad_wanted(asked: bool | None, vendor: str | None = None, capability: str | None = None) -> bool:
    """Whether the weights' gradients move to PyTorch's ``mm``: as ``asked``
    (``ORTOptions.cpu_weight_grad_swap``), else everywhere but on the CPUs where ORT's Gemm was
    measured the faster (``cpu_head_products.ORT_GEMM_CPUS``; the module docstring)."""
    if asked is not None:
        return asked
    from .cpu_head_products import on_ort_gemm_cpu

    return not on_ort_gemm_cpu(vendor, capability)


def _static_shapes(graph: GraphProto) -> dict[str, tuple[int, list[int]]]:
    """Element type and static dims (0 where unknown) of every value ``graph`` declares."""
    return {
        v.name: (v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
        for v in (*graph.value_info, *graph.output)
    }


def large_enough(rows: int, cols: int, min_dim: int = WEIGHT_GRAD_MIN_DIM) -> bool:
    """Whether a weight of ``rows`` x ``cols`` (out x in) is large enough for its gradient to move."""
    return rows >= min_dim and cols >= min_dim


def _weight_grad_product(node, readers: dict, shapes: dict, min_dim: int):
    """``(a, b, outputs, absorbed)`` where ``node`` (a Gemm ``X^T dY``) computes a large enough
    float32 weight gradient as ``a^T b`` into ``outputs``, else None. Read by a Transpose alone (an
    ``nn.Linear`` weight, out x in): ``dY^T X``, the Transpose ``absorbed``; otherwise (a ``Conv1D``
    weight, in x out, as GPT-2's layers hold theirs): the Gemm's own product, nothing absorbed."""
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
    x, dy = node.input[:2]
    users = readers.get(node.output[0], [])
    perms = [[list(a.ints) for a in u.attribute if a.name == "perm"] for u in users]
    if (
        len(users) == 1
        and users[0].op_type == "Transpose"
        and users[0].domain in ("", "ai.onnx")
        and perms == [[[1, 0]]]
    ):
        found = (dy, x, list(users[0].output), users[0])
    else:
        found = (x, dy, list(node.output), None)
    elem_type, dims = shapes.get(found[2][0], (0, []))
    if elem_type != TensorProto.FLOAT or len(dims) != 2 or not large_enough(*dims, min_dim):
        return None
    return found


def _after_label_sparsity(graph: GraphProto, readers: dict) -> set[str]:
    """The values computed from a ShrunkenGather's output (rows label sparsity cut), empty without one."""
    found: set[str] = set()
    todo = [name for node in graph.node if node.op_type == "ShrunkenGather" for name in node.output]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        todo += [out for reader in readers.get(name, []) for out in reader.output if out]
    return found


def swap_weight_grads(
    graph: GraphProto, threads: int, min_dim: int = WEIGHT_GRAD_MIN_DIM, labelled_rows_too: bool = False
) -> int:
    """Rewrite ``graph`` in place (see the module docstring); returns how many gradients moved.
    ``threads``: PyTorch's thread count for the products; ``min_dim``: :func:`large_enough`'s;
    ``labelled_rows_too``: also the weights whose input rows label sparsity cut."""
    original = list(graph.node)  # held: a node's id() stays its own while the list lives
    readers = readers_of(original)
    labelled_rows = set() if labelled_rows_too else _after_label_sparsity(graph, readers)
    shapes = _static_shapes(graph)
    replaced: dict[int, object] = {}
    dropped: set[int] = set()
    threads_name = f"ort_hf/weight_grad_threads_{threads}"
    for node in original:
        found = _weight_grad_product(node, readers, shapes, min_dim)
        if found is None or node.input[0] in labelled_rows:  # a sum over the labelled rows only (module docstring)
            continue
        a, b, outputs, absorbed = found
        replaced[id(node)] = helper.make_node(
            "ATen",
            [a, b, threads_name],
            outputs,
            name=f"{node.name or node.output[0]}/{OPERATOR.replace('::', '_')}",
            domain="org.pytorch.aten",
            operator=OPERATOR,
            overload_name="",
        )
        if absorbed is not None:
            dropped.add(id(absorbed))
    if not replaced:
        return 0
    rebuild_nodes(graph, original, replaced, dropped, first=[threads_constant(threads_name, threads)])
    return len(replaced)


def threads_constant(name: str, threads: int):
    """The int64 scalar Constant ``name`` holding the thread count an ort_hf product's ATen node reads."""
    return helper.make_node(
        "Constant", [], [name], name=name, value=helper.make_tensor(name, TensorProto.INT64, [], [threads])
    )
