"""Every bridge between onnxruntime-training 1.19.2 and today's torch lives here.

ORTModule 1.19.2 (Sep 2024) is the last release and was written against torch <= 2.4.
Each bridge says what moved, in which torch version, and when it can go. Bridges are
applied once, by :func:`apply_torch_bridges` (before ORTModule is imported) and
:func:`apply_ort_bridges` (right after), on first use of the engine, never on
``import ort_hf``. None changes what code outside an ORTModule export sees.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import sys
import warnings
import contextvars
import threading
import time
import types
from dataclasses import dataclass

_lock = threading.Lock()


@dataclass
class ExportRecord:
    """Per wrapped model: what the bridges saw during its ORT exports."""

    enable_label_sparsity: bool = True
    enable_mem_reuse: bool = False
    intra_op_threads: int | None = None  # None: ORT's default pool size
    intra_op_spinning: bool = True
    torch_threads: int | None = None  # PyTorch's threads while ORT runs (None: unchanged)
    export_cache_shared: bool = False  # ORTOptions.export_cache_shared
    export_count: int = 0
    export_seconds: float = 0.0


# The wrapped model whose forward is running: bridges below read its per-model settings,
# since ORT's hooks receive no per-model options of their own.
ACTIVE_EXPORT_RECORD: contextvars.ContextVar[ExportRecord | None] = contextvars.ContextVar(
    "ort_hf_active_export_record", default=None
)
_torch_done = False
_ort_done = False


def _alias_module(public_name: str, real_name: str) -> None:
    """Make ``import public_name`` and ``parent.attr`` resolve to ``real_name``."""
    if public_name in sys.modules:
        return
    module = importlib.import_module(real_name)
    sys.modules[public_name] = module
    parent_name, _, attr = public_name.rpartition(".")
    parent = importlib.import_module(parent_name)
    if not hasattr(parent, attr):
        setattr(parent, attr, module)


def _patch(owner, name: str, make_wrapper, static: bool = False) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)`` once (a second call is a no-op): the
    wrapper keeps the original's name and signature (``functools.wraps``; ORT inspects some)."""
    original = getattr(owner, name)
    if getattr(original, "_ort_hf_bridge", False):
        return
    wrapper = functools.wraps(original)(make_wrapper(original))
    wrapper._ort_hf_bridge = True
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)


def _bridge_torch_onnx_modules() -> None:
    # torch 2.9 moved the TorchScript exporter to torch.onnx._internal.torchscript_exporter
    # (pytorch#148252 and follow-ups); ORT 1.19.2 imports the old paths
    # torch.onnx._internal.jit_utils, torch.onnx._type_utils and torch.onnx._globals.
    # Can go when ORTModule is dropped or patched upstream (no upstream release will come).
    new = "torch.onnx._internal.torchscript_exporter"
    _alias_module("torch.onnx._internal.jit_utils", f"{new}.jit_utils")
    _alias_module("torch.onnx._type_utils", f"{new}._type_utils")
    _alias_module("torch.onnx._globals", f"{new}._globals")
    _alias_module("torch.onnx._internal.registration", f"{new}.registration")
    # torch 2.5 removed torch.onnx._internal._beartype (it was an identity decorator once
    # beartype checking was off, which it always was in releases). ORT only uses it to
    # decorate one function for ZeRO-3; an identity stand-in keeps that import working.
    if "torch.onnx._internal._beartype" not in sys.modules:
        beartype = types.ModuleType("torch.onnx._internal._beartype")
        beartype.beartype = lambda fn: fn
        sys.modules[beartype.__name__] = beartype
        import torch.onnx._internal as internal

        internal._beartype = beartype
    # torch 2.9 left torch.onnx.symbolic_opset9 as a re-export of the moved module's public
    # names only; ORT's aten::_convolution / _convolution_mode symbolics import the private
    # helpers from the old path (every Conv model failed to export with an ImportError).
    # Can go with the aliases above.
    import torch.onnx.symbolic_opset9 as public_opset9

    moved_opset9 = importlib.import_module(f"{new}.symbolic_opset9")
    for name in ("_convolution", "_convolution_mode"):
        if not hasattr(public_opset9, name):
            setattr(public_opset9, name, getattr(moved_opset9, name))


def _bridge_exporter_default() -> None:
    # torch 2.9 switched torch.onnx.export to dynamo=True by default. ORTModule needs the
    # TorchScript exporter (its symbolics, PythonOp export and autograd_inlining only exist
    # there) but never passes `dynamo`. Only calls made inside ORTModule's export context get
    # dynamo=False; every other caller sees torch's own default. functools.wraps keeps the
    # real signature visible: ORT inspects it for `autograd_inlining`.
    # Can go when ORTModule passes dynamo=False itself (never, upstream is frozen).
    import torch.onnx

    _patch(torch.onnx, "export", _export_with_dynamo_off)


def _export_with_dynamo_off(original):
    def export(*args, **kwargs):
        ortmodule = sys.modules.get("onnxruntime.training.ortmodule")
        in_ort_export = ortmodule is not None and ortmodule.ORTMODULE_ONNX_EXPORT_CONTEXT[0]
        if not in_ort_export:
            return original(*args, **kwargs)
        kwargs.setdefault("dynamo", False)
        record = ACTIVE_EXPORT_RECORD.get()
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if record is not None:
                record.export_count += 1
                record.export_seconds += time.perf_counter() - start

    return export


@contextlib.contextmanager
def without_unused_deepspeed():
    """Import ORTModule without importing DeepSpeed when nothing else did.

    ORTModule 1.19.2's ``__init__`` imports DeepSpeed, when installed, only to wrap
    ``deepspeed.checkpointing.checkpoint`` for export, and its ZeRO-3 offload hooks
    (``training.utils.hooks``, imported at the first export) import it too; that costs every ORT
    run a DeepSpeed import and its "Setting accelerator to CPU" banner. A process that uses
    DeepSpeed has imported it before (transformers does for ``--deepspeed``) and gets ORT's wrapper
    as before; ORTTrainer replaces activation checkpointing by ORT's recompute in any case.

    The ZeRO-3 offload hooks import a DeepSpeed internal that moved
    (``_apply_to_tensors_only``) and warn "DeepSpeed import error ..." whenever DeepSpeed is
    installed; ort_hf refuses ZeRO-3, so the hooks never run and the warning, about nothing in
    the user's run, is not shown. Can go with ORTModule."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DeepSpeed import error", category=UserWarning)
        if "deepspeed" in sys.modules:
            yield
            return
        sys.modules["deepspeed"] = None  # `import deepspeed` raises ImportError, which ORT suppresses
        try:
            yield
        finally:
            if sys.modules.get("deepspeed", 0) is None:
                del sys.modules["deepspeed"]


def apply_torch_bridges() -> None:
    """Bridges that must be in place before ``onnxruntime.training.ortmodule`` imports."""
    global _torch_done
    with _lock:
        if _torch_done:
            return
        _bridge_torch_onnx_modules()
        _bridge_exporter_default()
        _torch_done = True


def _bridge_cpu_nvtx() -> None:
    # torch.cuda.nvtx.range_push raises on CPU builds of torch (since ~2.2 the stub raises
    # "NVTX functions not installed"); ORT calls it unconditionally around every forward and
    # backward. Replace ORT's helpers, wherever ORT imported them by name, with versions
    # that do nothing when CUDA is unavailable. Can go with ORTModule.
    import torch
    from onnxruntime.training.utils import torch_profile_utils as tpu

    if getattr(tpu.torch_nvtx_range_push, "_ort_hf_bridge", False):
        return
    original_push, original_pop = tpu.torch_nvtx_range_push, tpu.torch_nvtx_range_pop

    def push(msg):
        if torch.cuda.is_available():
            original_push(msg)

    def pop():
        if torch.cuda.is_available():
            original_pop()

    push._ort_hf_bridge = pop._ort_hf_bridge = True
    replacements = {id(original_push): push, id(original_pop): pop}
    for name, module in list(sys.modules.items()):
        if not name.startswith("onnxruntime.training") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replacements:
                setattr(module, attr, replacements[id(value)])


def _bridge_sparsity_switches() -> None:
    # ORT 1.19.2 bugs, both in GraphTransitionManager: (a) the label-sparsity hook is gated by
    # the *embedding* switch, so ORTMODULE_ENABLE_LABEL_SPARSE_OPTIMIZER=0 is ignored; (b) when
    # that switch is off the hook returns None, and export then iterates None
    # ("TypeError: 'NoneType' object is not iterable"), so ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0
    # and ENABLE_COMPUTE_OPTIMIZER=0 crash. The wrapper gates the label hook by the active
    # model's own label switch and always returns a list. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    def wrap(original):
        def add_label_hook(enable_flag_from_ort, logger, runtime_inspector, flattened_module):
            record = ACTIVE_EXPORT_RECORD.get()
            enabled = record.enable_label_sparsity if record is not None else enable_flag_from_ort
            return original(enabled, logger, runtime_inspector, flattened_module) or []

        return add_label_hook

    _patch(GTM, "_add_check_label_sparsity_hook", wrap, static=True)


def _bridge_session_options() -> None:
    # Per-model session options ORTModule does not expose. Threads: the intra-op pool size and
    # whether its idle threads spin (ORTOptions.intra_op_threads / intra_op_spinning).
    # Memory reuse: ORTModule 1.19.2 hard-codes session_options.enable_mem_reuse = False in
    # GraphExecutionManager._get_session_config, so backward holds every activation and the
    # memory optimizer's recompute cannot lower the peak (ENGINE_NOTES measured it). The active
    # model's enable_mem_reuse decides instead. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager as GEM

    _patch(GEM, "_get_session_config", _session_config_per_model)


def _session_config_per_model(original):
    def get_session_config(self):
        session_options, providers, provider_options = original(self)
        if "CUDAExecutionProvider" in providers:
            from .cuda import require_driver, torch_uses_tf32

            require_driver()  # without libcuda.so.1, ORT aborts the process instead of raising
            # ORTModule leaves the provider's use_tf32 at its default (on): fp32 would silently
            # run in TF32 on Ampere and newer, where torch runs IEEE fp32 unless told otherwise.
            cuda_options = provider_options[providers.index("CUDAExecutionProvider")]
            cuda_options["use_tf32"] = "1" if torch_uses_tf32() else "0"
        record = ACTIVE_EXPORT_RECORD.get()
        if record is None:
            return session_options, providers, provider_options
        if record.enable_mem_reuse:
            session_options.enable_mem_reuse = True
        if record.intra_op_threads is not None:
            # ORTModule exposes no thread setting; its session otherwise takes one thread per core.
            session_options.intra_op_num_threads = record.intra_op_threads
        if not record.intra_op_spinning:
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return session_options, providers, provider_options

    return get_session_config


# Attribute of ORT's TrainingAgent: PyTorch's thread count while it runs (see below).
AGENT_TORCH_THREADS = "_ort_hf_torch_threads"


def _bridge_torch_threads_in_graph() -> None:
    # ORT calls PyTorch inside its graph runs (ATen nodes: the embeddings and their gradients;
    # PythonOps). Each call with more than one PyTorch thread wakes PyTorch's OpenMP workers,
    # and libgomp's default wait policy keeps them spinning for milliseconds afterwards, on the
    # cores ORT's own pool is running kernels on (ORTOptions.torch_threads_in_graph). ORT's
    # TrainingAgent gets the active model's setting when it is created, and every forward and
    # backward run sets PyTorch's threads to it and back. Can go with ORTModule.
    import torch
    from onnxruntime.training.ortmodule._execution_agent import TrainingAgent
    from onnxruntime.training.ortmodule._training_manager import TrainingManager

    def stamp_agent(create):
        def create_execution_agent(self):
            create(self)
            record = ACTIVE_EXPORT_RECORD.get()
            setattr(self._execution_agent, AGENT_TORCH_THREADS, record.torch_threads if record is not None else None)

        return create_execution_agent

    def with_torch_threads(run):
        def wrapped(self, *args, **kwargs):
            wanted = getattr(self, AGENT_TORCH_THREADS, None)
            before = torch.get_num_threads()
            if wanted is None or wanted == before:
                return run(self, *args, **kwargs)
            torch.set_num_threads(wanted)
            try:
                return run(self, *args, **kwargs)
            finally:
                torch.set_num_threads(before)

        return wrapped

    _patch(TrainingManager, "_create_execution_agent", stamp_agent)
    _patch(TrainingAgent, "run_forward", with_torch_threads)
    _patch(TrainingAgent, "run_backward", with_torch_threads)


def _bridge_mem_efficient_grad_device() -> None:
    # ORT 1.19.2 bug: GraphTransitionManager passes the dict of parameter names as the `device`
    # argument of post_processing_enable_mem_efficient_training, so memory-efficient gradient
    # management fails with "zeros(): argument 'device' must be torch.device, not dict". The
    # device is taken from the parameters instead. Can go with ORTModule.
    import torch
    from onnxruntime.training.ortmodule import _mem_efficient_grad_mgmt as mgmt

    def wrap(original):
        def post_processing(exported_model, named_params, device):
            named_params = list(named_params)
            if not isinstance(device, torch.device):
                device = named_params[0][1].device if named_params else "cpu"
            return original(exported_model, named_params, device)

        return post_processing

    _patch(mgmt, "post_processing_enable_mem_efficient_training", wrap)


def _bridge_export_cache() -> None:
    # ORT 1.19.2's export cache (ORTMODULE_CACHE_DIR) keys graphs by the module repr only,
    # writes them non-atomically, and reloads PythonOp graphs without registering their
    # functions: export_cache.cached_export keys, locks and validates it. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    from .export_cache import cached_export

    _patch(GTM, "_get_exported_model", lambda original: lambda **kwargs: cached_export(original, **kwargs),
           static=True)


def _bridge_frozen_parameters() -> None:
    # ORT 1.19.2 bug: GraphTransitionManager._export_model (_graph_transition_manager.py:772-777)
    # lists every parameter the graph reads as requiring a gradient, frozen or not, and leaves the
    # correction to _reprocess_check (:556) on a later forward; but ORT's default skip-check policy
    # (options.py:303, SKIP_CHECK_BUILD_GRADIENT) never calls it again after the first export
    # (_training_manager.py:248). So the gradient graph computes a gradient for every frozen weight
    # (LoRA's whole base model, a frozen embedding or encoder) and ORT drops them. The list is
    # cut here to the parameters that require grad at export, which is what _reprocess_check would
    # compute (user inputs keep ORT's own rule); a later change of requires_grad is caught by
    # recheck_trainable below. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    def wrap(original):
        def export_model(**kwargs):
            exported, schema, input_names, require_grad = original(**kwargs)
            frozen = {name for name, p in kwargs["flattened_module"].named_parameters() if not p.requires_grad}
            return exported, schema, input_names, [name for name in require_grad if name not in frozen]

        return export_model

    _patch(GTM, "_export_model", wrap, static=True)


@contextlib.contextmanager
def recheck_trainable(training_manager):
    """Let ORT compare, on the forward run inside, which parameters require grad with the ones its
    gradient graph was built for, and rebuild the graph and session (no re-export) if they differ.

    ORT's default skip-check policy skips that comparison after the first export (see
    _bridge_frozen_parameters): a parameter unfrozen later would get no gradient. The caller
    enters this only when requires_grad changed, so steps keep ORT's fast path. Can go with
    ORTModule."""
    from onnxruntime.training.ortmodule.options import _SkipCheck

    options = training_manager._runtime_options
    saved = options.skip_check
    # Both: the second creates the new session for the rebuilt graph (_training_manager.py:274).
    options.skip_check = _SkipCheck(
        saved & ~(_SkipCheck.SKIP_CHECK_BUILD_GRADIENT | _SkipCheck.SKIP_CHECK_EXECUTION_AGENT))
    try:
        yield
    finally:
        options.skip_check = saved


# Rows of the first batch that ORT's output-structure pass runs on (see below).
SCHEMA_PASS_ROWS = 2
# ORT's sparsity-check forward pre-hooks (GraphTransitionManager._add_check_*_sparsity_hook).
_ORT_DENSITY_HOOKS = ("_label_hook", "_embedding_hook")


def _bridge_output_schema_pass() -> None:
    # Before tracing, ORT 1.19.2 runs the whole model once in PyTorch, on the whole first batch,
    # only to learn the structure of its outputs (count, dtypes, ranks; every dimension is
    # exported dynamic), a full forward of the first step. It
    # now runs on the first SCHEMA_PASS_ROWS rows when every tensor input shares that leading
    # dimension, with ORT's sparsity-check hooks held back: their on/off decision and the
    # densities ORT's banner prints come from the trace, which
    # still sees the whole batch. If the short pass fails, ORT's own full pass runs.
    # With deepcopy_before_model_export (ORT's default), ORT runs that pass on a deep copy of the
    # whole module (_io.py:556) so that its writes (buffers, Python attributes) stay off the model:
    # the export's peak holds the weights twice. It runs on a copy sharing the parameters instead
    # (_structure_pass). ORT skips its copy on CUDA when twice the weights would not fit
    # (_io.can_module_be_deep_cloned); the shared copy always fits, so it is always made.
    # Can go with ORTModule.
    from onnxruntime.training.ortmodule import _io

    def wrap(original):
        def parse_outputs(module, flatten_args, logger, clone_module):
            sample = first_rows(flatten_args, SCHEMA_PASS_ROWS)
            if sample is not None:
                try:
                    with _without_density_hooks(module):
                        return _structure_pass(original, module, sample, logger, clone_module)
                except Exception as exc:  # noqa: BLE001 - ORT's own pass below decides
                    logger.info("ort_hf: the output-structure pass on %d rows failed (%s); running it on the whole "
                                "batch.", SCHEMA_PASS_ROWS, exc)
            return _structure_pass(original, module, flatten_args, logger, clone_module)

        return parse_outputs

    _patch(_io, "parse_outputs_for_onnx_export_and_extract_schema", wrap)
    _patch(_io, "can_module_be_deep_cloned", lambda original: lambda module, device: True)


def _structure_pass(original, module, inputs, logger, clone_module: bool):
    """ORT's output-structure pass; with ``clone_module``, on a copy of ``module`` whose buffers
    and Python state are its own and whose parameters are the model's (not copied).

    What ORT's full copy protected is kept: a forward that writes buffers or attributes writes the
    copy's. A forward that writes its own parameters in place would write the model's; the
    engine names such parameters in a warning (state_sync.StateWatch): under ORT those writes
    happen only while exporting, copy or not, since the trace runs on the model itself."""
    if not clone_module:
        return original(module, inputs, logger, False)
    try:
        shared = copy.deepcopy(module, {id(p): p for p in module.parameters()})
    except Exception:  # noqa: BLE001 - not copyable: ORT's own attempt, and its fallback, decide
        return original(module, inputs, logger, True)
    return original(shared, inputs, logger, False)


def first_rows(inputs, rows: int):
    """``inputs`` with every tensor cut to its first ``rows`` rows, or None when the tensors
    do not share one leading (batch) dimension longer than ``rows``."""
    import torch

    batched = [t for t in inputs if isinstance(t, torch.Tensor) and t.ndim > 0]
    if not batched or batched[0].shape[0] <= rows or any(t.shape[0] != batched[0].shape[0] for t in batched):
        return None
    return [t[:rows] if isinstance(t, torch.Tensor) and t.ndim > 0 else t for t in inputs]


@contextlib.contextmanager
def _without_density_hooks(module):
    def is_density_hook(hook) -> bool:  # ORT registers them as functools.partial(_label_hook, name)
        return getattr(getattr(hook, "func", None), "__name__", "") in _ORT_DENSITY_HOOKS

    saved = []
    for sub in module.modules():
        hooks = sub._forward_pre_hooks
        found = [key for key, hook in hooks.items() if is_density_hook(hook)]
        if found:
            saved.append((hooks, hooks.copy()))
            for key in found:
                del hooks[key]
    try:
        yield
    finally:
        for hooks, before in saved:
            hooks.clear()
            hooks.update(before)


def make_sampler_reusable(sampler) -> None:
    """ORT 1.19.2 bug: LoadBalancingDistributedSampler tests ``if not self.sample_complexities``
    on the numpy array it cached, so its second use (``set_epoch`` for the next epoch) raises
    "truth value of an array ... is ambiguous". Give the cached array a plain truth value.
    Can go with ORTModule."""
    import numpy as np

    class _Complexities(np.ndarray):
        def __bool__(self) -> bool:
            return self.size > 0

    if isinstance(sampler.sample_complexities, np.ndarray):
        sampler.sample_complexities = sampler.sample_complexities.view(_Complexities)


def apply_ort_bridges() -> None:
    """Bridges applied to ORT's own modules right after they import."""
    global _ort_done
    with _lock:
        if _ort_done:
            return
        _bridge_cpu_nvtx()
        _bridge_sparsity_switches()
        _bridge_session_options()
        _bridge_torch_threads_in_graph()
        _bridge_mem_efficient_grad_device()
        _bridge_export_cache()
        _bridge_output_schema_pass()
        _bridge_frozen_parameters()
        _ort_done = True
