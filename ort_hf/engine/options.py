"""ORTOptions: every ORTModule knob ort_hf exposes, typed and validated.

ORTModule is steered by ``ORTMODULE_*`` environment variables read when a model is wrapped.
:func:`scoped_environ` sets them only around the construction of one wrapped model and
restores the caller's environment afterwards, so nothing leaks into the user's process.
Two ORT switch bugs are worked around in ``compat`` rather than passed through here:
the label-sparsity switch is ignored by ORT and the ``0`` of the embedding/compute switches
crashes export.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

from .._field_choices import check_choices

# ORT 1.19.2 engages label sparsity (and embedding sparsity) only below this share of used
# positions (runtime_inspector's density check, first batch).
SPARSITY_THRESHOLD = 0.9

# The smallest rows and columns (out x in) of a linear weight whose gradient moves to PyTorch by
# default (cpu_weight_grad.py): a layer's projection, not a LoRA factor of rank below it. The
# architecture sweep lowers it to 1, so that its tiny models' weights move as real-sized ones would.
WEIGHT_GRAD_MIN_DIM = 128
# The bound for a linear weight's forward product and input gradient (cpu_linear_products.py has
# the measurements): a BERT-base-sized layer's, not a MiniLM's or a 55M LoRA model's.
LINEAR_PRODUCT_MIN_DIM = 768

# ORT prints memory-optimizer plans as "<cluster id>:<strategy>:<request count>", e.g.
# "BiasGelu+:1:-1" (strategy 1 = recompute, 2 = recompute with compromise, count -1 = all).
# A plan may combine several clusters with commas, as ORT prints them.
_PLAN_RE = re.compile(r"^[^:\s,]+:[12]:-?\d+(,[^:\s,]+:[12]:-?\d+)*$")


def _opt(default=None, help: str = "", factory=None, choices: tuple | None = None):
    """An option: its default, its help and its choices, declared once (``ORTTrainingArguments``
    reads all three; HfArgumentParser makes the choices argparse's)."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# Read in ORT 1.19.2's onnxruntime/training/ort_triton against Triton 3.7.1 (what torch 2.13's CUDA
# build requires), compiling ORT's generated and hand-written kernels offline to cubins: fused Pow
# (ORT emits tl.math.pow, gone in Triton 3), fp16/bf16 Gelu/GeluGrad/QuickGelu (tl.erf/tl.exp take
# fp32 only now), Tanh and flash attention (tl.dot's trans_a/trans_b) fail to compile, and ORT
# re-raises that at the first step. ORT's CPU build ignores ORTMODULE_USE_TRITON without a word.
USE_TRITON_REFUSED = (
    "ORTOptions.use_triton (--ort_use_triton) is refused: ORT 1.19.2's Triton code generator was written for Triton "
    "2.x and fails to compile common fused kernels (Pow, fp16 Gelu/GeluGrad) with the Triton 3.7 that torch 2.13 "
    "requires, and ORT's CPU build ignores it. Leave it off: ORT runs those ops with its own CUDA kernels."
)


@dataclass(frozen=True)
class ORTOptions:
    """Typed options for one model trained through ORTModule; each field's ``help`` (its
    metadata, also the ``--ort_<field>`` help of ``ORTTrainingArguments``) says what it does.
    Invalid values are rejected when the options are built, with a message naming the field.
    """

    log_level: str = _opt(
        "WARNING",
        "ORTModule's log level (VERBOSE .. FATAL). WARNING prints ORT's warnings, including why it falls back.",
        choices=("VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL"),
    )
    fallback: str = _opt(
        "auto",
        "'auto': fall back to PyTorch (reason logged once) when ORT cannot export or run "
        "the model; 'disable': raise ORTFallbackError naming the unsupported op.",
        choices=("auto", "disable"),
    )
    # From opset 17 ``LayerNormalization`` is the standard ONNX op, which ORT 1.19's compute
    # optimizer does not move the labels' gather or the token flattening through; at 16 it is
    # ORT's own op and the gather reaches into the last layer (symbolics, ``aten::gelu``).
    # 14-20: where ORT 1.19's gradient builders and torch's TorchScript exporter overlap.
    opset_version: int = _opt(
        16,
        "ONNX opset of ORT's training export (14-20); 16 lets label sparsity reach into the last layer.",
        choices=tuple(range(14, 21)),
    )
    save_onnx: bool = _opt(False, "Write the exported and optimised ONNX graphs to --ort_onnx_dir.")
    onnx_dir: str | None = _opt(None, "Folder for --ort_save_onnx (default: the current directory).")
    profile_dir: str | None = _opt(
        None,
        "Write ONNX Runtime's per-node profile of the training session into this "
        "folder when training ends (a Chrome-trace JSON: every kernel's time at "
        "every step). Slows training; for finding where a step's time goes.",
    )
    enable_compute_optimizer: bool = _opt(True, "ORT's FLOP-reduction graph passes.")
    enable_label_sparsity: bool = _opt(
        True,
        "Compute the loss only on non-ignored labels (needs the loss through "
        "an nn.CrossEntropyLoss module: ModuleWithLoss).",
    )
    enable_embedding_sparsity: bool = _opt(
        True, "ORT's padding elimination from embedding inputs (CUDA only in ORT 1.19)."
    )
    memory_opt_level: int = _opt(
        0,
        "Recompute: 0 off (or --ort_memory_opt_plans), 1 transformer layer-wise, 2 layer-wise plus compromised plans.",
        choices=(0, 1, 2),
    )
    memory_opt_plans: tuple[str, ...] = _opt(
        factory=tuple, help="Recompute plans as ORT prints them, 'cluster:strategy:count' (e.g. BiasGelu+:1:-1)."
    )
    export_cache_dir: str | None = _opt(
        None,
        "Cache exported ONNX graphs here between runs (ORTMODULE_CACHE_DIR; "
        "private to you, checked: see docs/security.md).",
    )
    export_cache_shared: bool = _opt(
        False,
        "The export cache is shared with a group on purpose: accept group "
        "ownership and group write below it (every graph is still checked "
        "against its hash).",
    )
    deepcopy_before_export: bool = _opt(
        True,
        "Run the export's output-structure pass on a copy of the model's "
        "buffers and Python attributes, so it does not change them (the "
        "weights are shared, not copied).",
    )
    enable_custom_autograd: bool = _opt(
        True,
        "Run torch.autograd.Function as ORT PythonOp (needed by label "
        "sparsity detection and memory-efficient gradients).",
    )
    mem_efficient_grad_mgmt: bool = _opt(False, "Hand each gradient to PyTorch as soon as ORT computes it.")
    use_triton: bool = _opt(
        False,
        "Refused when on (see USE_TRITON_REFUSED): ORT's Triton code generator does not "
        "work with the Triton torch 2.13 installs, and ORT's CPU build ignores it.",
    )
    # ORT registers this optimiser process-wide and reads its variable only at import
    # (ortmodule_build._enable_efficient_attention): once a model asked for it, later CUDA models
    # get it too.
    use_efficient_attention: bool = _opt(
        False,
        "CUDA only: replace the attention subgraph by PyTorch's "
        "memory-efficient attention kernels (process-wide once enabled).",
    )
    eval_in_ort: bool = _opt(False, "Evaluate and predict through ORT's inference mode instead of PyTorch.")
    trim_padding: bool | None = _opt(
        None,
        "Drop trailing all-padding columns of each training batch before ORT "
        "(results unchanged: masked out, no labels). Default: on for CPU, off on "
        "CUDA (ORT's padding elimination).",
    )
    eliminate_padding: bool | None = _opt(
        None,
        "Run the token-wise layers on the real tokens only, as ORT's CUDA-only "
        "padding elimination does. Default: on for CPU when the batch that "
        "builds the graph gains from it (docs/how-it-works.md). CPU only: on "
        "CUDA ORT's own runs instead, and True is refused.",
    )
    enable_mem_reuse: bool | None = _opt(
        None,
        "Let ORT's session reuse activation buffers (ORT 1.19.2 hard-codes "
        "it off). Default: on when recompute is on, which is what makes "
        "recompute lower the peak.",
    )
    intra_op_threads: int | None = _opt(
        None,
        "Threads of ORT's intra-op pool. Default: ORT's own (one per physical "
        "core), independent of torch.set_num_threads / OMP_NUM_THREADS.",
    )
    # Spinning pool threads hold the cores that the kernels ORT hands to PyTorch (its ATen nodes:
    # embeddings and their gradients) need; each such kernel then waits for the scheduler.
    intra_op_spinning: bool | None = _opt(
        None, "Let ORT's idle pool threads spin between kernels. Default: off on CPU, ORT's default (on) on CUDA."
    )
    cpu_dropout_kernels: bool = _opt(
        True,
        "CPU: run the graph's dropout and its gradient on ort_hf's kernels "
        "(threaded, counter-based masks seeded per step) instead of ORT's serial "
        "ones; same contract (engine/cpu_kernel_swaps.py). False keeps ORT's, "
        "as does recompute (ORT recomputes only its own).",
    )
    cpu_embedding_grad_kernel: bool = _opt(
        True,
        "CPU: compute the gradient of an embedding lookup into a weight on "
        "ort_hf's kernel, which reuses its vocabulary-sized buffer instead of "
        "allocating it every step; same sums (engine/cpu_kernel_swaps.py).",
    )
    cpu_tied_embedding_grad: bool = _opt(
        True,
        "CPU: where a table tied to the output head gets both gradients, add the embedding's rows into "
        "the head's weight gradient in place (when that gradient is PyTorch's product) instead of "
        "zeroing a vocabulary-sized buffer and summing the two; the same values "
        "(engine/cpu_tied_embedding_grad.py). Needs cpu_embedding_grad_kernel.",
    )
    cpu_gather_grad_swap: bool = _opt(
        True,
        "CPU: compute the gradient of label sparsity's gather of the labelled rows (ORT's GatherGrad) "
        "with PyTorch's embedding_backward instead of ORT's slower kernel; the same values "
        "(engine/cpu_kernel_swaps.py).",
    )
    cpu_gelu_grad_swap: bool = _opt(
        True,
        "CPU: run ORT's GELU gradients (BiasGeluGrad_dX for the exact erf form, FastGeluGrad "
        "and BiasFastGeluGrad_dX for the tanh form) as PyTorch's vectorised gelu_backward "
        "(engine/cpu_kernel_swaps.py).",
    )
    cpu_norm_grad_swap: bool = _opt(
        True,
        "CPU: run ORT's LayerNorm and RMSNorm gradients (LayerNormalizationGrad, "
        "SimplifiedLayerNormalizationGrad) on PyTorch's native_layer_norm_backward and ort_hf's "
        "vectorised RMSNorm gradient (engine/cpu_grad_swaps.py).",
    )
    cpu_softmax_grad_swap: bool = _opt(
        True,
        "CPU: run ORT's softmax gradient (SoftmaxGrad_13: attention probabilities) on PyTorch's "
        "vectorised _softmax_backward_data, as eager's softmax gradient; faster steps "
        "(engine/cpu_grad_swaps.py).",
    )
    cpu_relu_grad_swap: bool = _opt(
        True,
        "CPU: run ORT's ReLU gradient (ReluGrad: T5's and OPT's feed-forward) on PyTorch's "
        "vectorised threshold_backward, as eager's ReLU gradient; ORT's values wherever the "
        "activation is a number, and faster steps (engine/cpu_grad_swaps.py).",
    )
    cpu_weight_grad_swap: bool | None = _opt(
        None,
        "CPU: compute the gradients of linear weights (the layers' projections and a causal LM's "
        "head; those whose rows label sparsity cut only with cpu_linear_product_swap) with PyTorch's "
        "matrix product instead of ORT's Gemm; same sums. Default: on, but off on AMD CPUs with "
        "AVX512, where ORT's Gemm was measured faster (engine/cpu_weight_grad.py).",
    )
    cpu_weight_grad_min_dim: int = _opt(
        WEIGHT_GRAD_MIN_DIM,
        "CPU: the fewest rows and columns of a weight whose gradient cpu_weight_grad_swap moves "
        "(smaller products, such as a LoRA factor's, gain nothing) (engine/cpu_weight_grad.py).",
    )
    cpu_linear_product_swap: bool | None = _opt(
        None,
        "CPU: compute the linear layers' (nn.Linear's, GPT-2's Conv1D's) forward products and their inputs' "
        "gradients with PyTorch's matrix product instead of ORT's MatMul and Gemm, and the weight gradient "
        "of a head over the rows label sparsity kept (engine/cpu_weight_grad.py); same products. Default: "
        "on Intel CPUs, where it was measured faster at the layers' shapes, off on the others (an AMD "
        "EPYC's were even) (engine/cpu_linear_products.py).",
    )
    cpu_linear_product_min_dim: int = _opt(
        LINEAR_PRODUCT_MIN_DIM,
        "CPU: the fewest rows and columns of a weight whose forward product and input gradient "
        "cpu_linear_product_swap moves (smaller ones measured no faster) (engine/cpu_linear_products.py).",
    )
    cpu_flash_attention: bool = _opt(
        True,
        "CPU: run SDPA attention as PyTorch's own flash-attention kernel inside ORT's graph, where eager "
        "PyTorch runs that kernel (float32, no dropout, no mask or a boolean one, one head width), "
        "without keeping the attention probabilities for the backward (engine/symbolics/flash_attention.py). "
        "False keeps ORT's decomposition.",
    )
    cpu_lm_head_forward_swap: bool | None = _opt(
        None,
        "CPU: run the fused chunked LM head's forward product (--ort_chunked_lm_loss) on ORT's "
        "MatMul instead of PyTorch's mm; same products. Default: on AMD CPUs, where it was measured "
        "faster on a vocabulary's weight, off on the others (an Intel Xeon's mm was faster) "
        "(engine/cpu_head_products.py).",
    )
    cpu_lm_head_input_grad_swap: bool | None = _opt(
        None,
        "CPU: run the fused chunked LM head's hidden-state gradient product (--ort_chunked_lm_loss) on "
        "ORT's MatMul instead of PyTorch's mm; same product. Default: on AMD CPUs with AVX512, where it "
        "was measured faster, off on the others (engine/cpu_head_products.py).",
    )
    cpu_lm_head_weight_grad_swap: bool | None = _opt(
        None,
        "CPU: run the fused chunked LM head's weight-gradient product (--ort_chunked_lm_loss) on ORT's "
        "Gemm instead of PyTorch's mm; same product. Default: on AMD CPUs with AVX512 of /proc/cpuinfo "
        "family 26, where it was measured faster, off on the others (engine/cpu_head_products.py).",
    )
    cpu_cross_entropy_swap: bool = _opt(
        True,
        "CPU: compute the in-graph cross-entropy as ONNX LogSoftmax then "
        "NegativeLogLikelihoodLoss (threaded) instead of ORT's serial "
        "SoftmaxCrossEntropyLossInternal, and its gradient with ort_hf's vectorised kernel instead of "
        "ORT's serial one; same loss and gradient (engine/cpu_kernel_swaps.py).",
    )
    preflight: str = _opt(
        "auto",
        "Before the first optimizer step, check ORT's graph against PyTorch on the first batch and "
        "on a longer copy of it (dropout off, a separate session): same loss and gradients, "
        "or the model is refused before training. 'auto': for every model class the "
        "architecture sweep has not proven exact (docs/architectures.md); 'always'; 'never'.",
        choices=("auto", "always", "never"),
    )
    # Why one thread by default: model_hooks._bridge_torch_threads_in_graph.
    torch_threads_in_graph: int | None = _opt(
        None,
        "PyTorch's intra-op threads while ORT runs the training graph. "
        "Default: 1 on CPU, unchanged on CUDA; 0 leaves "
        "torch.set_num_threads as it is (custom autograd functions with "
        "heavy CPU work); n sets n.",
    )

    def __post_init__(self) -> None:
        check_choices(self, ORTOptions, lambda name: f"ORTOptions.{name}")
        for f in fields(self):  # the switches' type, from their annotation
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"ORTOptions.{f.name} must be True or False, got {value!r}.")
            if f.type == "bool | None" and value is not None and not isinstance(value, bool):
                raise ValueError(f"ORTOptions.{f.name} must be True, False or None (auto), got {value!r}.")
        _check_optional_int(
            "intra_op_threads", self.intra_op_threads, 1, "a positive integer or None (ORT's default: one per core)"
        )
        _check_optional_int("cpu_weight_grad_min_dim", self.cpu_weight_grad_min_dim, 1, "a positive integer")
        _check_optional_int("cpu_linear_product_min_dim", self.cpu_linear_product_min_dim, 1, "a positive integer")
        _check_optional_int(
            "torch_threads_in_graph",
            self.torch_threads_in_graph,
            0,
            "None (auto: 1 on CPU), 0 (leave PyTorch's setting) or a positive integer",
        )
        if isinstance(self.memory_opt_plans, str):
            raise ValueError("ORTOptions.memory_opt_plans must be a list of plan strings, not one string.")
        object.__setattr__(self, "memory_opt_plans", tuple(self.memory_opt_plans))
        for plan in self.memory_opt_plans:
            if not isinstance(plan, str) or not _PLAN_RE.match(plan):
                raise ValueError(
                    f"ORTOptions.memory_opt_plans: {plan!r} is not a plan as ORT prints them "
                    "('<cluster id>:<strategy 1|2>:<count>', e.g. 'BiasGelu+:1:-1')."
                )
        if self.memory_opt_plans and self.memory_opt_level:
            raise ValueError(
                "ORTOptions.memory_opt_level and ORTOptions.memory_opt_plans: set either a level (1 or 2) "
                "or plans, not both: a level turns on every plan of that level."
            )
        if self.onnx_dir is not None and not self.save_onnx:
            raise ValueError("ORTOptions.onnx_dir is set but save_onnx is False: set save_onnx=True to write graphs.")
        for name in ("export_cache_dir", "onnx_dir", "profile_dir"):
            folder = getattr(self, name)
            if folder and os.path.exists(folder) and not os.path.isdir(folder):
                raise ValueError(f"ORTOptions.{name}: {folder!r} is a file, not a folder; give a folder path.")
        if self.use_triton is True:
            raise ValueError(USE_TRITON_REFUSED)
        if self.mem_efficient_grad_mgmt and not self.enable_custom_autograd:
            raise ValueError(
                "ORTOptions.mem_efficient_grad_mgmt needs enable_custom_autograd=True (it runs on PythonOp)."
            )

    @property
    def memory_optimizer_on(self) -> bool:
        return bool(self.memory_opt_level or self.memory_opt_plans)

    @property
    def mem_reuse_on(self) -> bool:
        return self.memory_optimizer_on if self.enable_mem_reuse is None else self.enable_mem_reuse


def _check_optional_int(name: str, value, minimum: int, allowed: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"ORTOptions.{name} must be {allowed}, got {value!r}.")


def environment_for(options: ORTOptions) -> dict[str, str]:
    """The ``ORTMODULE_*`` variables ORTModule reads at construction for these options."""
    env = {
        "ORTMODULE_ONNX_OPSET_VERSION": str(options.opset_version),
        "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE" if options.fallback == "disable" else "",
        "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER": str(int(options.enable_compute_optimizer)),
        # Passed for the feature banner; the label hook itself is steered in compat (ORT ignores this).
        "ORTMODULE_ENABLE_LABEL_SPARSE_OPTIMIZER": str(int(options.enable_label_sparsity)),
        "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER": str(int(options.enable_embedding_sparsity)),
        "ORTMODULE_MEMORY_OPT_LEVEL": str(options.memory_opt_level),
        "ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT": str(int(options.deepcopy_before_export)),
        "ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT": str(int(options.mem_efficient_grad_mgmt)),
        "ORTMODULE_USE_TRITON": str(int(options.use_triton)),
    }
    if options.fallback == "auto":
        del env["ORTMODULE_FALLBACK_POLICY"]  # ORT's own default policy
    if options.export_cache_dir:
        env["ORTMODULE_CACHE_DIR"] = options.export_cache_dir
    if options.save_onnx:
        env["ORTMODULE_SAVE_ONNX_PATH"] = options.onnx_dir or os.getcwd()
    if options.memory_opt_plans:
        env["ORTMODULE_MEMORY_OPT_CONFIG"] = _write_plan_config(options.memory_opt_plans)
    return env


def overridden_by_options(env: dict[str, str], environ=os.environ) -> list[tuple[str, str, str]]:
    """The user's exported ``ORTMODULE_*`` variables that ``env`` (the options') sets otherwise:
    ``(name, user's value, ours)``. Variables ``env`` does not set reach ORT as they are."""
    return [
        (k, environ[k], v)
        for k, v in env.items()
        if k in environ and environ[k] != v and k != "ORTMODULE_MEMORY_OPT_CONFIG"
    ]


def _write_plan_config(plans: tuple[str, ...]) -> str:
    # ORT reads chosen plans from a JSON file (a list of plan strings) whose path it keeps and
    # re-reads when it builds the session; the file must outlive the construction.
    fd, path = tempfile.mkstemp(prefix="ort_hf_memory_plans_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(list(plans), f)
    return path


@contextlib.contextmanager
def scoped_environ(updates: dict[str, str]) -> Iterator[None]:
    """Set ``updates`` in ``os.environ`` for the block, then restore exactly what was there."""
    saved = {key: os.environ.get(key) for key in updates}
    try:
        os.environ.update(updates)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
