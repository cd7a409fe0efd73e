"""ORT's per-model hooks: what ort_hf adds to ORTModule 1.19.2 for each wrapped model.

ORTModule exposes no per-model session settings, thread control or export cache worth keeping;
these wrap its methods (through ``compat._patch``) and read the running model's settings from
``export_record.ACTIVE_EXPORT_RECORD``. Unlike the bridges in ``compat.py``, they are features,
not repairs; they go with ORTModule all the same. Applied once, by :func:`apply_model_hooks`,
right after ORTModule imports.
"""

from __future__ import annotations

import copy
import os
import threading

from .compat import _patch
from .export_record import ACTIVE_EXPORT_RECORD
from .trace_schema import SKIP_STRUCTURE_PASS

_lock = threading.Lock()
_done = False


def _bridge_session_options() -> None:
    # Per-model session options ORTModule does not expose. Threads: the intra-op pool size and
    # whether its idle threads spin (ORTOptions.intra_op_threads / intra_op_spinning).
    # Memory reuse: ORTModule 1.19.2 hard-codes session_options.enable_mem_reuse = False in
    # GraphExecutionManager._get_session_config, so backward holds every activation and the
    # memory optimizer's recompute cannot lower the peak (docs/memory.md). The active
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
        if record.profile_dir:
            # ORTModule has no profiling switch; ORT writes the file when the session's profiling
            # ends (TrainingSessionInspection.end_profiling).
            os.makedirs(record.profile_dir, exist_ok=True)
            session_options.enable_profiling = True
            session_options.profile_file_prefix = os.path.join(record.profile_dir, "ort_training_profile")
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

    _patch(TrainingManager, "_create_execution_agent", lambda create: stamp_agent(_one_session_build(create)))
    _patch(TrainingAgent, "run_forward", with_torch_threads)
    _patch(TrainingAgent, "run_backward", with_torch_threads)


def _bridge_export_cache() -> None:
    # ORT 1.19.2's export cache (ORTMODULE_CACHE_DIR) keys graphs by the module repr only,
    # writes them non-atomically, and reloads PythonOp graphs without registering their
    # functions: export_cache.cached_export keys, locks and validates it. Can go with ORTModule.
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as GTM

    from . import trace_schema
    from .export_cache import cached_export
    from .symbolics.flash_attention import recording_eager_kernel_choice

    def wrap(original):
        def exported(**kwargs):
            with recording_eager_kernel_choice():
                return trace_schema.export_with_schema_from_trace(original, **kwargs)

        return lambda **kwargs: cached_export(exported, **kwargs)

    _patch(GTM, "_get_exported_model", wrap, static=True)


def _one_session_build(create):
    """``TrainingManager._create_execution_agent`` building one session where ORT 1.19.2 builds two.

    Its memory observer is always on, so ORT first builds a session only to read the memory
    optimizer's recompute plans (find_memory_optimization_opportunity, which reads the session's
    graph through get_serialized_ortmodule_memory_stat), before the optimizer's config is added to
    the session options, drops it, and builds the session that trains. With no recompute asked for
    (level 0 and no plan file: the config ORT adds is empty), both sessions come from the same graph
    and options, so the plans are read from the training session. With recompute on, the plans
    decide the training session's config (levels 1 and 2 write it from them): ORT's own order runs.
    With no recompute, reading the plans (sympy over every recomputable subgraph: 0.7 s of a 55M
    model's first step) waits until something asks for them (memory_plans.read_memory_plans), unless
    ORT's log level prints them in its banner.
    Installed with the thread stamp below (one wrapper per method). Can go with ORTModule."""
    from onnxruntime.training.ortmodule.options import LogLevel, _MemoryOptimizationLevel

    def create_execution_agent(self):
        observer, options = self._runtime_inspector.memory_ob, self._runtime_options
        if not (
            observer.is_enabled()
            and options.memory_optimization_level == _MemoryOptimizationLevel.USER_SPECIFIED
            and not options.memory_optimizer_config_file_path
        ):
            return create(self)
        observer._is_enabled = False  # read by _create_execution_agent only to build the probe session
        try:
            create(self)
        finally:
            observer._is_enabled = True
        if self._debug_options.logging.log_level < LogLevel.WARNING:
            observer.find_memory_optimization_opportunity(self._execution_agent, options)
        else:
            self._ort_hf_plans_pending = True

    return create_execution_agent


def _bridge_output_schema_pass() -> None:
    # ORT 1.19.2 runs the whole model once in PyTorch before tracing, only to learn the structure
    # of its outputs. That pass is skipped (the trace gives the structure: trace_schema); it still
    # runs where ORT loads its own cached graph, or where the trace's outputs cannot be named as
    # the exporter names them.
    # With deepcopy_before_model_export (ORT's default), ORT runs that pass on a deep copy of the
    # whole module (_io.py:556) so that its writes (buffers, Python attributes) stay off the model:
    # the export's peak holds the weights twice. It runs on a copy sharing the parameters instead
    # (_structure_pass). ORT skips its copy on CUDA when twice the weights would not fit
    # (_io.can_module_be_deep_cloned); the shared copy always fits, so it is always made.
    # Can go with ORTModule.
    from onnxruntime.training.ortmodule import _io

    def wrap(original):
        def parse_outputs(module, flatten_args, logger, clone_module):
            if SKIP_STRUCTURE_PASS.get():
                return [], {}, None
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


def apply_model_hooks() -> None:
    global _done
    with _lock:
        if _done:
            return
        _bridge_session_options()
        _bridge_torch_threads_in_graph()
        _bridge_export_cache()
        _bridge_output_schema_pass()
        _done = True
