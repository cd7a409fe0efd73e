"""The normalisation, softmax and ReLU gradients of ORT 1.19.2's CPU training graphs, swapped for
kernels computing the same values with less CPU time (``cpu_kernel_swaps`` runs them, as it runs
the other swaps).

Each was found in ORT's per-node profile of the families users fine-tune. The figures are CPU time
a call, ORT's kernel alone on 2 intra-op threads against the swap's kernel on the one thread ORT's
graph gives PyTorch, on a 2-core AMD EPYC with AVX2 that other jobs shared
(``scripts/kernel_microbench.py``; its output and the per-family profiles are in
``docs/results/kernel-profiles/``). On an idle machine ORT's kernels spread over both cores, so
the step time gains at most half the ratio of CPU time. The profiles taken inside training, on
that busy machine, confirm the LayerNorm gradient's gain (and the RMSNorm gradient's in Llama, not
in T5) and leave the softmax and ReLU gradients' unproven there (their README). The ReLU gradient's
was then timed step against step in one process on a 2-core Intel Xeon with AVX512: an OPT-125M-wide
causal LM (``scripts/heldout_models.py``'s ``opt-6x768``, batch 4 x 256) took a median 3214 ms a
step with it against 3378 without, and 3234 against 3378 in a second run
(``scripts/paired_option_steps.py --option cpu_relu_grad_swap``;
``docs/results/relu-grad/intel-xeon-avx512-2cpu/``). It is a selection, so it gives ORT's values bit
for bit wherever the activation is a number; where it is NaN, it passes the gradient on, as eager
PyTorch's ReLU gradient does, and ORT's gives 0. It is on by default. The softmax gradient's swap
runs eager PyTorch's own kernel, within 1e-5 of ORT's values (its test); timed the same way on the
MiniLM MLM workload on the Xeon, the median step was 1112 ms with it against 1133 without, faster in
6 of 8 paired calls (``--option cpu_softmax_grad_swap --calls 8 --steps 6``;
``docs/results/softmax-grad/intel-xeon-avx512-2cpu/``). It is on by default too.

- ``LayerNormalizationGrad`` (BERT, RoBERTa, DeBERTa, ELECTRA, OPT, GPT-NeoX, BART: every LayerNorm)
  becomes ORT's ``ATen`` node calling ``aten::native_layer_norm_backward`` with the mean and
  inverse standard deviation ORT's forward saved (2048 x 256: 3.6 ms against 0.8 ms).
- ``SimplifiedLayerNormalizationGrad`` (RMSNorm: Llama, Qwen2, Gemma, Phi-3, T5) becomes ort_hf's
  ``rms_norm_backward`` (``csrc/cpu_rms_norm_grad.cpp``; PyTorch has no CPU kernel for it)
  (2048 x 256: 10.6 ms against 1.9 ms). Both behind ``ORTOptions.cpu_norm_grad_swap``.
- ``SoftmaxGrad_13`` (every attention's probabilities) becomes ort_hf's ``softmax_backward``
  (``csrc/cpu_softmax_grad.cpp``: PyTorch's ``_softmax_backward_data``, whose dtype argument ORT's
  ATen node cannot pass, writing a result of 32 MiB or more into a kept buffer) (8 x 4 x 256 x 256:
  9.0 ms against 3.0 ms; 8 x 8 x 512 x 512: 70 ms against 26 ms), behind
  ``ORTOptions.cpu_softmax_grad_swap``.
- ``ReluGrad`` (T5's and OPT's feed-forward ReLU) becomes ort_hf's ``relu_backward``
  (``csrc/cpu_relu_grad.cpp``: PyTorch's ``threshold_backward`` at 0, what PyTorch's own ReLU
  gradient runs, whose Scalar threshold ORT's ATen node cannot pass) (2048 x 1024: 13.7 ms against
  3.0 ms), behind ``ORTOptions.cpu_relu_grad_swap``.

Left with ORT: SiLU's gradient (``QuickGeluGrad`` with alpha 1: Llama, Qwen2, Phi-3), which takes
at most twice PyTorch's ``silu_backward`` CPU time on the same shapes, less than ORT's two threads
give back; and ``GatherElementsGrad`` (DeBERTa's relative-position gathers, 9.6% of ORT's node time
for a DeBERTa-v2 classifier), for which PyTorch's ``scatter_add_`` into zeros takes less CPU time
alone (64 x 128 x 128 into 64 x 128 x 512: 22.7 ms against 8.8 ms) but took as long in training
(its node 8.9% of ORT's node time, against ORT's 9.6%).

Only float32, and the norms and softmax only over the last axis (``axis`` -1), the form every
model's export gave.
"""

from __future__ import annotations

from onnx import TensorProto, helper

_ATEN = "org.pytorch.aten"


def _prefix(node) -> str:
    return node.name or node.output[0]


def _aten(node, inputs: list[str], outputs: list[str], operator: str, ctx) -> dict:
    ctx.new_types.update(dict.fromkeys(outputs, TensorProto.FLOAT))
    return helper.make_node(
        "ATen",
        inputs,
        outputs,
        name=f"{_prefix(node)}/{operator.replace('::', '_')}",
        domain=_ATEN,
        operator=operator,
        overload_name="",
    )


def _last_axis_float(node, attrs: dict, ctx, inputs: int) -> bool:
    return (
        attrs.get("axis", -1) == -1 and len(node.input) == inputs and ctx.types.get(node.input[0]) == TensorProto.FLOAT
    )


def layer_norm_grad(node, attrs: dict, ctx) -> list | None:
    # LayerNormalizationGrad(dY, X, scale, mean, inv_std_var) -> (dX, dscale, dbias)
    if not _last_axis_float(node, attrs, ctx, 5):
        return None
    dy, x, scale, mean, inv_std = node.input
    shape = f"{_prefix(node)}/normalized_shape"
    # native_layer_norm_backward(grad, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    # the scale stands in for the bias, whose shape it has (the kernel reads only its shape, to
    # size dbias). ORT's node has all three outputs (its schema requires them), so all are computed.
    return [
        helper.make_node("Shape", [scale], [shape], name=f"{_prefix(node)}/Shape"),
        _aten(
            node,
            [dy, x, shape, mean, inv_std, scale, scale, ctx.int64_vector((1, 1, 1))],
            list(node.output),
            "native_layer_norm_backward",
            ctx,
        ),
    ]


def rms_norm_grad(node, attrs: dict, ctx) -> list | None:
    # SimplifiedLayerNormalizationGrad(dY, X, scale, inv_std_var) -> (dX, dscale)
    if not ctx.own_rms_norm_grad or not _last_axis_float(node, attrs, ctx, 4):
        return None
    return [_aten(node, list(node.input), list(node.output), "ort_hf::rms_norm_backward", ctx)]


def relu_grad(node, attrs: dict, ctx) -> list | None:
    # ReluGrad(dY, X) -> dX: dY where X > 0, else 0
    if not ctx.own_relu_grad or len(node.input) != 2 or ctx.types.get(node.input[0]) != TensorProto.FLOAT:
        return None
    return [_aten(node, list(node.input), list(node.output), "ort_hf::relu_backward", ctx)]


def softmax_grad(node, attrs: dict, ctx) -> list | None:
    # SoftmaxGrad_13(dY, Y) -> dX
    if not ctx.own_softmax_grad or not _last_axis_float(node, attrs, ctx, 2):
        return None
    inputs = [*node.input, ctx.int64_scalar(-1)]
    return [_aten(node, inputs, list(node.output), "ort_hf::softmax_backward", ctx)]
