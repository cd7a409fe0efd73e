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
from dataclasses import asdict, dataclass, field
from typing import Iterator

# ORT 1.19.2 engages label sparsity (and embedding sparsity) only below this share of used
# positions (runtime_inspector's density check, first batch).
SPARSITY_THRESHOLD = 0.9

LOG_LEVELS = ("VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL")
FALLBACK_POLICIES = ("auto", "disable")
MIN_OPSET, MAX_OPSET = 14, 20  # ORT 1.19 gradient builders and torch's TorchScript exporter overlap
MEMORY_OPT_LEVELS = (0, 1, 2)
# ORT prints memory-optimizer plans as "<cluster id>:<strategy>:<request count>", e.g.
# "BiasGelu+:1:-1" (strategy 1 = recompute, 2 = recompute with compromise, count -1 = all).
# A plan may combine several clusters with commas, as ORT prints them.
_PLAN_RE = re.compile(r"^[^:\s,]+:[12]:-?\d+(,[^:\s,]+:[12]:-?\d+)*$")


@dataclass(frozen=True)
class ORTOptions:
    """Typed options for one model trained through ORTModule.

    Args:
        log_level: ORTModule's log level (``VERBOSE`` .. ``FATAL``). ``WARNING`` prints ORT's
            one-time feature banner; ``ERROR`` keeps it quiet.
        fallback: ``"auto"`` lets ORT fall back to PyTorch when it cannot export or run the
            model (ort_hf logs the reason once); ``"disable"`` raises instead.
        opset_version: ONNX opset of ORT's training export (14-20). 16 by default: from 17 on,
            ``LayerNormalization`` is the standard ONNX op, which ORT 1.19's compute optimizer
            does not move the labels' gather or the token flattening through, so label
            sparsity stops at the first LayerNorm above the loss; at 16 it is ORT's own op and
            the gather reaches into the last layer (see ``symbolics``, ``aten::gelu``).
        save_onnx: write the exported/optimised ONNX graphs to ``onnx_dir``.
        onnx_dir: folder for ``save_onnx`` (defaults to the current directory).
        enable_compute_optimizer: ORT's FLOP-reduction graph passes.
        enable_label_sparsity: shrink the loss computation to non-ignored labels (needs the
            loss through an ``nn.CrossEntropyLoss`` module, see ModuleWithLoss).
        enable_embedding_sparsity: padding elimination from embedding inputs (CUDA only in ORT).
        memory_opt_level: 0 off (or ``memory_opt_plans``), 1 transformer layer-wise recompute,
            2 layer-wise plus compromised plans.
        memory_opt_plans: explicit recompute plans as ORT prints them, ``cluster:strategy:count``.
        export_cache_dir: cache exported ONNX graphs here between runs (ORTMODULE_CACHE_DIR).
        export_cache_shared: the export cache is shared with a group on purpose: group ownership
            and group write are accepted below its root (``trust``); hashes are still checked.
        deepcopy_before_export: export from a copy so the first step does not touch weights.
        enable_custom_autograd: run ``torch.autograd.Function`` as ORT PythonOp (needed for
            label sparsity detection and memory-efficient gradients).
        mem_efficient_grad_mgmt: hand gradients to PyTorch as soon as ORT computes them.
        use_triton: CUDA only: let ORT run some ops through Triton.
        use_efficient_attention: CUDA only: ORT's graph optimiser that replaces the attention
            subgraph by PyTorch's memory-efficient attention kernels. ORT registers it process-wide
            (it reads ``ORTMODULE_USE_EFFICIENT_ATTENTION`` once, at import): once a model asked
            for it, every later CUDA model in the process gets it.
        eval_in_ort: run evaluation/prediction through ORT's inference mode instead of PyTorch.
        enable_mem_reuse: let ORT's session reuse activation buffers (ORT 1.19.2 hard-codes it
            off). ``None`` = on whenever the memory optimizer is on, where it decides whether
            recompute lowers the peak at all.
        trim_padding: drop trailing all-padding columns of each training batch before ORT runs
            it (results unchanged: those positions are masked out and carry no label). ``None``
            = on for CPU models, off on CUDA, where ORT's own padding elimination applies.
        intra_op_threads: threads of ORT's intra-op pool. ``None`` = ORT's default (one per
            physical core), whatever ``torch.set_num_threads`` says; set it to give ORT the
            same threads as PyTorch.
        intra_op_spinning: let the idle threads of ORT's pool spin between kernels. Spinning
            threads hold the cores that the kernels ORT hands to PyTorch (the ATen ops:
            embeddings and their gradients) need, so each such kernel waits for the scheduler
            (2-3 ms per call on 2 cores). ``None`` = off for CPU models, ORT's default (on) on CUDA.
        torch_threads_in_graph: PyTorch's intra-op threads while ORT runs the training graph.
            ORT calls PyTorch for some nodes (the embeddings and their gradients as ATen nodes,
            custom autograd functions as PythonOps). With more than one thread, each such call
            wakes PyTorch's OpenMP workers, which then spin for milliseconds (libgomp's default
            wait policy) on the cores ORT's own pool is using. ``None`` = 1 for CPU models,
            unchanged on CUDA; ``0`` leaves ``torch.set_num_threads`` as it is (for graphs whose
            PythonOps do heavy CPU work); ``n`` sets n. Restored after every ORT call.
    """

    log_level: str = "WARNING"
    fallback: str = "auto"
    opset_version: int = 16
    save_onnx: bool = False
    onnx_dir: str | None = None
    enable_compute_optimizer: bool = True
    enable_label_sparsity: bool = True
    enable_embedding_sparsity: bool = True
    memory_opt_level: int = 0
    memory_opt_plans: tuple[str, ...] = field(default_factory=tuple)
    export_cache_dir: str | None = None
    export_cache_shared: bool = False
    deepcopy_before_export: bool = True
    enable_custom_autograd: bool = True
    mem_efficient_grad_mgmt: bool = False
    use_triton: bool = False
    use_efficient_attention: bool = False
    eval_in_ort: bool = False
    trim_padding: bool | None = None
    enable_mem_reuse: bool | None = None
    intra_op_threads: int | None = None
    intra_op_spinning: bool | None = None
    torch_threads_in_graph: int | None = None

    def __post_init__(self) -> None:
        _check_choice("log_level", self.log_level, LOG_LEVELS)
        _check_choice("fallback", self.fallback, FALLBACK_POLICIES)
        for name in (
            "save_onnx",
            "enable_compute_optimizer",
            "enable_label_sparsity",
            "enable_embedding_sparsity",
            "deepcopy_before_export",
            "enable_custom_autograd",
            "mem_efficient_grad_mgmt",
            "use_triton",
            "use_efficient_attention",
            "eval_in_ort",
            "export_cache_shared",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ORTOptions.{name} must be True or False, got {getattr(self, name)!r}.")
        for name in ("trim_padding", "enable_mem_reuse", "intra_op_spinning"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"ORTOptions.{name} must be True, False or None (auto), got {value!r}.")
        _check_optional_int("intra_op_threads", self.intra_op_threads, 1,
                            "a positive integer or None (ORT's default: one per core)")
        _check_optional_int("torch_threads_in_graph", self.torch_threads_in_graph, 0,
                            "None (auto: 1 on CPU), 0 (leave PyTorch's setting) or a positive integer")
        if not isinstance(self.opset_version, int) or not MIN_OPSET <= self.opset_version <= MAX_OPSET:
            raise ValueError(
                f"ORTOptions.opset_version must be an integer from {MIN_OPSET} to {MAX_OPSET}, "
                f"got {self.opset_version!r}."
            )
        if self.memory_opt_level not in MEMORY_OPT_LEVELS:
            raise ValueError(
                f"ORTOptions.memory_opt_level must be 0 (off), 1 (layer-wise recompute) or 2 "
                f"(layer-wise plus compromised plans), got {self.memory_opt_level!r}."
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
        for name in ("export_cache_dir", "onnx_dir"):
            folder = getattr(self, name)
            if folder and os.path.exists(folder) and not os.path.isdir(folder):
                raise ValueError(f"ORTOptions.{name}: {folder!r} is a file, not a folder; give a folder path.")
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

    def to_dict(self) -> dict:
        return asdict(self)


def _check_optional_int(name: str, value, minimum: int, allowed: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"ORTOptions.{name} must be {allowed}, got {value!r}.")


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"ORTOptions.{name} must be one of {', '.join(map(str, choices))}; got {value!r}.")


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
    return [(k, environ[k], v) for k, v in env.items() if k in environ and environ[k] != v
            and k != "ORTMODULE_MEMORY_OPT_CONFIG"]


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
