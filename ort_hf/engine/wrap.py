"""wrap_model: a torch module that trains through ORTModule, and says whether it did."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from . import compat
from .export_record import ACTIVE_EXPORT_RECORD, ExportRecord
from .model_hooks import AGENT_TORCH_THREADS
from .errors import ORTFallbackError
from .._model_state import restore_buffers
from .options import ORTOptions, environment_for, overridden_by_options, scoped_environ
from .runtime import EngineState, ensure_engine, register_symbolics
from .failures import describe_failure
from .memory_plans import MemoryPlan, plan_key
from .padding import trim_trailing_padding
from .precision import check_precision
from .state_sync import BUFFERS_ARG, StatefulForward, StateWatch

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class EngineStatus:
    """What ran the forwards of a wrapped model that went to ORT.

    ``backend`` is ``"ort"`` once an ORT session executed, ``"pytorch"`` after a fallback
    (``fallback_reason`` says why) or once ``--use_ort auto`` chose PyTorch (no reason), and
    ``"not_run"`` before the first such forward.
    """

    backend: str
    fallback_reason: str | None
    export_count: int
    export_seconds: float
    pythonop: bool


class ORTTrainingModule(nn.Module):
    """Trains ``module`` through ORTModule; evaluates in PyTorch unless ``eval_in_ort``.

    Parameters and ``state_dict`` are the wrapped model's under the ``module.`` prefix, as
    with DDP, so ``transformers``/``accelerate`` unwrap it the usual way; attributes the
    wrapper does not have (``config``, ``save_pretrained``...) are read from the model.
    """

    def __init__(self, module: nn.Module, ort_module: nn.Module, options: ORTOptions, state: EngineState):
        super().__init__()
        self.module = module
        on_cuda = any(p.is_cuda for p in module.parameters())
        record = ExportRecord()
        record.configure(options, on_cuda)
        forward_params = inspect.signature(module.forward).parameters
        config = getattr(module, "config", None)
        self._set(
            _ort=ort_module,  # not registered as a submodule: ORTModule shares the parameters above
            options=options,
            _pythonop=state.pythonop_available and options.enable_custom_autograd,
            _on_cuda=on_cuda,
            _record=record,
            _fallback_reason=None,
            _ran=False,
            _use_pytorch=False,
            _stateful=None,  # a StatefulForward once forward was seen writing buffers
            _trainable=None,  # requires_grad of each parameter at the last training step
            _trim_padding=options.trim_padding if options.trim_padding is not None else not on_cuda,
            padding_stats={"kept_tokens": 0, "total_tokens": 0},
            # ORT cannot return a DynamicCache (ORTModuleIOError: Unsupported flatten data type).
            _disable_cache="use_cache" in forward_params and bool(getattr(config, "use_cache", False)),
        )
        self._ort.train(module.training)

    def _set(self, **values) -> None:
        # Plain attributes, past nn.Module's __setattr__ (which would register ORTModule as a child).
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)

    def train(self, mode: bool = True):
        super().train(mode)
        if self._ort is not None:
            self._ort.train(mode)
        return self

    def forward(self, *args, **kwargs):
        if self._use_pytorch or (not self.training and not self.options.eval_in_ort):
            return self.module(*args, **kwargs)
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            args, kwargs = (), dict(args[0])  # ORTModule rejects BatchEncoding; plain dict it is
        if self.training and self._disable_cache:
            kwargs.setdefault("use_cache", False)
        if self.training and self._trim_padding:
            # ORT's padding elimination exists only in its CUDA build: on CPU the columns that are
            # padding in every row are dropped here, which leaves the loss unchanged.
            kwargs, kept, total = trim_trailing_padding(kwargs)
            if total > 0:
                rows = kwargs["attention_mask"].shape[0]
                self.padding_stats["kept_tokens"] += kept * rows
                self.padding_stats["total_tokens"] += total * rows
        if not self._ran:
            check_precision(self.module)  # refused loudly, never a fallback
        _set_custom_autograd(self._pythonop)
        token = ACTIVE_EXPORT_RECORD.set(self._record)
        try:
            with self._trainable_check():
                output = self._run_ort(args, kwargs)
        except Exception as exc:
            if self._ran or isinstance(exc, ORTFallbackError):
                raise  # ORT ran before: a runtime error, not something a fallback should hide
            if self.options.fallback == "disable":
                raise ORTFallbackError(
                    f"ORT could not run {type(self.module).__name__} and fallback is disabled: "
                    f"{describe_failure(exc)}. Set fallback='auto' to train it in PyTorch instead."
                ) from exc
            # ORT's own fallback covers export failures only; a failure building the gradient
            # graph or the session arrives here. Same policy: say why once, train in PyTorch.
            self._record_fallback(describe_failure(exc))
            self._set(_use_pytorch=True)
            return self.module(*args, **kwargs)
        finally:
            ACTIVE_EXPORT_RECORD.reset(token)
        self._note_backend()
        return output

    def _trainable_check(self):
        """ORT's gradient graph outputs gradients for the parameters that required grad when it was
        built; when that changed since the last training step (a layer unfrozen or frozen), ORT
        compares again and rebuilds its graph on this step (compat.recheck_trainable)."""
        if not self.training:
            return contextlib.nullcontext()
        trainable = tuple(p.requires_grad for p in self.module.parameters())
        changed = self._trainable is not None and trainable != self._trainable
        self._set(_trainable=trainable)
        return compat.recheck_trainable(self._training_manager()) if changed else contextlib.nullcontext()

    def _run_ort(self, args, kwargs):
        """ORT's forward, with the buffers ``forward`` writes kept as PyTorch keeps them (state_sync)."""
        stateful = self._stateful
        if stateful is not None:
            saved = stateful.snapshot()
            output, written, stats = self._ort(*args, **{BUFFERS_ARG: stateful.buffer_inputs()}, **kwargs)
            # Undone: an export's Python forwards, and ORT's BatchNormalization, which can write its
            # running statistics in place into the buffer memory it shares with PyTorch.
            restore_buffers(self.module, saved)
            if self.training:
                stateful.apply(written, stats)
            return output
        if self._ran or not self.training:
            return self._ort(*args, **kwargs)
        watch = StateWatch(self.module)
        output = self._ort(*args, **kwargs)
        watch.report_python_state()
        written = watch.written_buffers()
        if not written or self._ort._fallback_manager.is_pending():
            return output
        watch.restore()
        logger.info("ort_hf: forward writes buffers (%s); they are carried through the ORT graph and updated "
                    "after every step as in PyTorch (re-exporting once).", ", ".join(written))
        self._set(_stateful=StatefulForward(self.module, written))
        self._set(_ort=_build_ort_module(self._stateful, self.options, ensure_engine()))
        self._ort.train(self.training)
        return self._run_ort(args, kwargs)

    def _note_backend(self) -> None:
        first = not self._ran
        self._set(_ran=True)
        if first and self.training and self.training_graph() is not None:
            self._check_requested_plans()
        manager = self._ort._fallback_manager
        if self._fallback_reason is None and manager.is_pending():
            self._record_fallback(describe_failure(manager._exception))

    def _record_fallback(self, reason: str) -> None:
        self._set(_ran=True, _fallback_reason=reason)
        logger.warning(
            "ort_hf: ORT could not run %s; training continues in PyTorch. Reason: %s", type(self.module).__name__, reason
        )

    def use_pytorch(self, enabled: bool = True) -> None:
        """Run the next training forwards in PyTorch (``True``) or through the ORT session again
        (``False``); session and weights stay as they are (to time PyTorch steps inside a run)."""
        if self._fallback_reason is None:
            self._set(_use_pytorch=enabled)

    def finish_in_pytorch(self) -> None:
        """Train the rest of the run in PyTorch and free the ORT session (``--use_ort auto``
        measured PyTorch faster); ``engine_status().backend`` is ``"pytorch"`` from now on."""
        self.use_pytorch(True)
        self.release()

    def reconfigure(self, options: ORTOptions) -> None:
        """Rebuild the ORT session with new options (re-exports on the next forward); the
        module, its parameters and the optimizer stay as they are."""
        state = ensure_engine()
        register_symbolics(state, options.opset_version)
        # Free the old session before the new one exports: otherwise both are alive during the
        # re-export, and a budget measured after it includes the dead session's buffers.
        self.release()
        target = self._stateful if self._stateful is not None else self.module
        self._set(_ort=_build_ort_module(target, options, state), options=options, _ran=False,
                  _pythonop=state.pythonop_available and options.enable_custom_autograd)
        self._record.configure(options, self._on_cuda)
        self._ort.train(self.training)

    def release(self) -> None:
        """Drop the ORT session (and its buffers) of a module that will not run again, e.g. the
        one replaced when ``auto_find_batch_size`` retries with a smaller batch."""
        self._set(_ort=None)
        _release_freed_memory()

    def reseed(self, seed: int) -> None:
        """Seed ORT's own random generator (dropout masks inside the ORT graph).

        ORT's generator is not part of torch's RNG state, so the Trainer's checkpoints cannot
        restore it; seeding it from (seed, step) makes masks a function of the step, so a
        resumed run draws the same masks as an uninterrupted one."""
        import onnxruntime

        onnxruntime.set_seed(seed % (2**63))

    def _training_manager(self):
        """ORTModule's training execution manager (``None`` if ORT was never brought up)."""
        return self._ort._torch_module._execution_manager(True) if hasattr(self._ort, "_torch_module") else None

    def training_graph(self):
        """The optimised ONNX training graph (forward + gradient) ORT built, after the first
        training step; ``None`` before it or after a fallback. For inspection: check graphs,
        not banners."""
        onnx_models = getattr(self._training_manager(), "_onnx_models", None)
        return getattr(onnx_models, "optimized_model", None)

    def _session(self):
        agent = getattr(self._training_manager(), "_execution_agent", None)
        return getattr(agent, "_inference_session", None)

    def session_providers(self) -> list[str]:
        """The execution providers of the training session (after the first training step)."""
        session = self._session()
        return session.get_providers() if session is not None else []

    def cuda_provider_options(self) -> dict[str, str] | None:
        """The options ORT's CUDA provider runs the training session with (``use_tf32``, ...), as
        ORT reports them; None without a CUDA session."""
        session = self._session()
        return session.get_provider_options().get("CUDAExecutionProvider") if session is not None else None

    def session_threading(self) -> dict | None:
        """The training session's intra-op pool as ORT was asked to run it: ``threads`` (0 = ORT's
        default, one per core) and ``spinning``; and ``torch_threads``, PyTorch's threads while
        ORT runs (``None``: left as they are). ``None`` before the first training step or after a
        fallback."""
        agent = getattr(self._training_manager(), "_execution_agent", None)
        session = getattr(agent, "_inference_session", None)
        if session is None:
            return None
        options = session.get_session_options()
        try:
            spinning = options.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: ORT's default, spinning
            spinning = "1"
        return {"threads": options.intra_op_num_threads, "spinning": spinning != "0",
                "torch_threads": getattr(agent, AGENT_TORCH_THREADS, None)}

    def memory_plans(self) -> list[MemoryPlan] | None:
        """The memory optimizer's plan table (after the first training step), largest saving first."""
        if self.training_graph() is None:
            return None
        manager = self._training_manager()
        found = manager._runtime_inspector.memory_ob.cluster_id_combination_to_saving_symbolics_map
        enabled: set[str] = set()
        config = manager._runtime_options.memory_optimizer_config_file_path
        if config:
            import json

            with open(config) as f:
                for entry in json.load(f):
                    enabled.update(k for k, part in zip(plan_key(entry), entry.split(",")) if not part.endswith(":0"))
        return [
            MemoryPlan(
                plan=cluster,
                frequency=int(summary.freq),
                bytes_saved=summary.evaluated_saving if isinstance(summary.evaluated_saving, float) else None,
                symbolic_saving=str(summary.simplified_symbolic_saving_expr),
                enabled=bool(plan_key(cluster)) and all(k in enabled for k in plan_key(cluster)),
            )
            for cluster, summary in found.items()
        ]

    def _check_requested_plans(self) -> None:
        """A requested plan ORT did not find is a typo or a model change: say which plans exist."""
        if not self.options.memory_opt_plans:
            return
        import difflib

        found = self.memory_plans() or []
        known = {k for p in found for k in plan_key(p.plan)}
        for plan in self.options.memory_opt_plans:
            missing = [k for k in plan_key(plan) if k not in known]
            if missing:
                valid = ", ".join(p.plan for p in found) or "none (the graph has no recomputable subgraph)"
                close = difflib.get_close_matches(missing[0], sorted(known), n=1)
                hint = f" Did you mean '{close[0]}:-1'?" if close else ""
                raise ValueError(
                    f"ORTOptions.memory_opt_plans: ORT found no plan '{plan}' in this model.{hint} "
                    f"Valid plans: {valid}."
                )

    def label_sparsity_fired(self) -> bool | None:
        """Whether ORT rewrote the loss to run on non-ignored labels only, read from the graph
        (ShrunkenGather before the loss); ``None`` before the first training step."""
        graph = self.training_graph()
        if graph is None:
            return None
        return any(node.op_type == "ShrunkenGather" for node in graph.graph.node)

    def mem_efficient_grad_active(self) -> bool | None:
        """Whether ORT pulls the parameters through its weight-retrieval PythonOps (memory-efficient
        gradient management), read from the graph; ``None`` before the first training step."""
        graph = self.training_graph()
        if graph is None:
            return None
        return any(node.op_type == "PythonOp" and node.name.startswith("weight_retrieval_") for node in graph.graph.node)

    def engine_status(self) -> EngineStatus:
        if not self._ran:
            backend = "not_run"
        elif self._fallback_reason is not None or self._ort is None:
            backend = "pytorch"
        else:
            backend = "ort"
        return EngineStatus(
            backend=backend,
            fallback_reason=self._fallback_reason,
            export_count=self._record.export_count,
            export_seconds=self._record.export_seconds,
            pythonop=self._pythonop,
        )


def _release_freed_memory() -> None:
    """Collect unreachable ORT objects and hand freed heap pages back to the OS (glibc), so the
    process RSS shows what is really in use."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS may keep freed pages, nothing else changes


def _set_custom_autograd(enabled: bool) -> None:
    # ORT keeps custom-autograd support as process state, read at export; models wrapped with
    # different settings each get theirs back before their forward.
    from onnxruntime.training.ortmodule import _custom_autograd_function as caf

    if caf.custom_autograd_function_enabler.state != enabled:
        caf.enable_custom_autograd_support(enabled)


def wrap_model(model: nn.Module, options: ORTOptions | None = None) -> ORTTrainingModule:
    """Return a module that trains ``model`` through ONNX Runtime's ORTModule.

    The model keeps its parameters (an optimizer built on ``model.parameters()`` steps the
    weights ORT trains). Check ``engine_status()`` after the first training step to see
    whether ORT executed or fell back to PyTorch.
    """
    options = options or ORTOptions()
    state = ensure_engine()
    register_symbolics(state, options.opset_version)
    return ORTTrainingModule(model, _build_ort_module(model, options, state), options, state)


def _build_ort_module(model: nn.Module, options: ORTOptions, state: EngineState) -> nn.Module:
    from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

    _set_custom_autograd(state.pythonop_available and options.enable_custom_autograd)
    if options.save_onnx and options.onnx_dir:
        os.makedirs(options.onnx_dir, exist_ok=True)  # ORT refuses a folder that does not exist yet
    debug = DebugOptions(
        log_level=LogLevel[options.log_level],
        save_onnx=options.save_onnx,
        onnx_prefix=type(model).__name__ if options.save_onnx else "",
        save_path=options.onnx_dir or "",
    )
    env = environment_for(options)
    for name, theirs, ours in overridden_by_options(env):
        if (name, theirs, ours) not in _WARNED_ENV:
            _WARNED_ENV.add((name, theirs, ours))
            logger.warning("ort_hf: %s=%s in the environment is overridden by ORTOptions (%s=%s, the "
                           "--ort_* arguments): set the option instead.", name, theirs, name, ours)
    if options.use_efficient_attention:
        _enable_efficient_attention()
    plan_file = env.get("ORTMODULE_MEMORY_OPT_CONFIG")  # a temp file ORT re-reads at every session build
    try:
        with scoped_environ(env):
            ort_module = ORTModule(model, debug_options=debug)
    except BaseException:
        _remove_file(plan_file)
        raise
    if plan_file:
        weakref.finalize(ort_module, _remove_file, plan_file)  # lives exactly as long as the session
    return ort_module


_WARNED_ENV: set[tuple[str, str, str]] = set()


def _enable_efficient_attention() -> None:
    # ORT registers this graph optimiser only if ORTMODULE_USE_EFFICIENT_ATTENTION=1 when
    # onnxruntime.training.ortmodule is imported (graph_optimizers/__init__.py); importing the
    # module registers it (for CUDA graphs) whenever a model asks for it.
    from onnxruntime.training.ortmodule.graph_optimizers import _aten_attn  # noqa: F401


def _remove_file(path: str | None) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
