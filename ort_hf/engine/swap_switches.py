"""Which of ``cpu_kernel_swaps``' rewrites a model gets: each speed swap has a switch in
``ORTOptions`` (:data:`SWITCHES`); the corrections (``conv_grad``, ``gemm``: ORT's CPU kernels write out
of bounds or fail where torch computes) have none: without them the graph is wrong, never slower."""

from __future__ import annotations

SWITCHES = {
    "cross_entropy": "cpu_cross_entropy_swap",
    "gelu_grad": "cpu_gelu_grad_swap",
    "norm_grad": "cpu_norm_grad_swap",
    "softmax_grad": "cpu_softmax_grad_swap",
    "relu_grad": "cpu_relu_grad_swap",
    "dropout": "cpu_dropout_kernels",
    "embedding_grad": "cpu_embedding_grad_kernel",
    "gather_grad": "cpu_gather_grad_swap",
    "tied_embedding_grad": "cpu_tied_embedding_grad",
    "weight_grad": "cpu_weight_grad_swap",
    "linear_product": "cpu_linear_product_swap",
    "flash_attention": "cpu_flash_attention",
}
CORRECTIONS = frozenset({"conv_grad", "gemm"})
ALL_SWAPS = frozenset(SWITCHES) | CORRECTIONS


def cpu_default(option: str) -> bool:
    """The default of a switch that is unset (None) by default: as this CPU decides."""
    from .cpu_linear_products import linear_products_wanted
    from .cpu_weight_grad import weight_grad_wanted

    deciders = {"cpu_linear_product_swap": linear_products_wanted, "cpu_weight_grad_swap": weight_grad_wanted}
    return deciders[option](None)


def switched_on(options, option: str) -> bool:
    """Whether ``options``' switch ``option`` is on; unset (None), as the CPU decides (:func:`cpu_default`)."""
    value = getattr(options, option)
    return cpu_default(option) if value is None else value


def wanted_swaps(options, device_type: str) -> frozenset[str]:
    """The swaps a model trained with ``options`` (``ORTOptions``) on ``device_type`` gets: none off
    the CPU (ORT's CUDA kernels are other ones, and ort_hf's run on CPU only), else the corrections and
    each speed swap whose switch is on. ORT's recompute can redraw its own Dropout (it seeds the
    node) and recompute its own MatMul, not an ATen node in their place: with recompute on, the
    dropout and the layers' forward products stay ORT's so that its plans keep their savings."""
    if device_type != "cpu":
        return frozenset()
    wanted = {name for name, option in SWITCHES.items() if switched_on(options, option)}
    if options.memory_optimizer_on:
        wanted -= {"dropout", "linear_product"}
    return frozenset(wanted) | CORRECTIONS
