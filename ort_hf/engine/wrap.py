"""wrap_model: a torch module that trains through ORTModule, and says whether it did."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from .._model_state import restore_buffers
from . import compat, placement
from .cpu_kernel_swaps import release_kernel_buffers
from .errors import ORTFallbackError
from .export_record import ACTIVE_EXPORT_RECORD, ExportRecord
from .failures import describe_failure
from .options import ORTOptions
from .ortmodule_build import build_ort_module, release_freed_memory, set_custom_autograd
from .padding import decoder_side, trim_trailing_padding, without
from .padding_elimination import padding_unread, worth_eliminating
from .precision import check_precision
from .preflight import refuse_layer_drop, run_preflight
from .proven import model_class_name
from .runtime import EngineState, ensure_engine, register_symbolics
from .session_inspection import TrainingSessionInspection
from .state_sync import BUFFERS_ARG, StatefulForward, StateWatch
from .trace_fixes import apply_trace_fixes
from .wrap_settings import WrapSettings, rewrites_line

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
    swapped: dict[str, int]  # the nodes of the last training graph swapped for ort_hf's kernels, by op type


@dataclass
class RunState:
    """What the wrapped model's forwards have found out so far."""

    ran: bool = False  # a forward went to ORT (or fell back)
    checked: bool = False  # the pre-flight ran (or was not wanted)
    fallback_reason: str | None = None
    use_pytorch: bool = False  # training forwards run in PyTorch (fallback, timing, --use_ort auto)
    stateful: StatefulForward | None = None  # once forward was seen writing buffers
    trainable: tuple[bool, ...] | None = None  # requires_grad of each parameter at the last training step


class ORTTrainingModule(TrainingSessionInspection, nn.Module):
    """Trains ``module`` through ORTModule; evaluates in PyTorch unless ``eval_in_ort``.

    Parameters and ``state_dict`` are the wrapped model's under the ``module.`` prefix, as
    with DDP, so ``transformers``/``accelerate`` unwrap it the usual way; attributes the
    wrapper does not have (``config``, ``save_pretrained``...) are read from the model.
    """

    def __init__(self, module: nn.Module, ort_module: nn.Module, options: ORTOptions, state: EngineState):
        super().__init__()
        self.module = module
        self._settings = WrapSettings.of(module, options, state)
        self._record = ExportRecord()
        self._record.configure(options, self._settings.device_type)
        self._run = RunState()
        self.padding_stats = {"kept_tokens": 0, "total_tokens": 0}
        self._step_seed: list[int] | None = None  # [seed, step, forwards since] (seed_steps)
        self._set_ort(ort_module)
        self._built_for = self._placement()  # (device type, parameter dtypes) the session was built for
        self._ort.train(module.training)
        weakref.finalize(self, release_kernel_buffers).atexit = False

    def _set_ort(self, ort_module: nn.Module | None) -> None:
        # A plain attribute, past nn.Module's __setattr__ (which would register ORTModule as a
        # child): ORTModule shares the wrapped model's parameters, which are ours already.
        object.__setattr__(self, "_ort", ort_module)

    @property
    def options(self) -> ORTOptions:
        return self._settings.options

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

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .half() and DeepSpeed's own move and cast all come here: a session built
        # for other devices or dtypes is rebuilt (its kernels and rewrites were chosen for them).
        super()._apply(fn, recurse)
        if self._ort is not None and self._placement() != self._built_for:
            self._follow_move()
        return self

    def _placement(self) -> tuple:
        dtypes = tuple(sorted({str(p.dtype) for p in self.module.parameters()}))
        return placement.model_device_type(self.module), dtypes

    def _placed_as_built(self, args: tuple, kwargs: dict) -> bool:
        """At every training step, from the first parameter (a move or cast of the wrapped model
        itself bypasses ``_apply``): still on the device type and dtypes the session was built for."""
        first = next(self.module.parameters(), None)
        device, dtypes = self._built_for
        same_device = placement.step_device_type(self.module, args, kwargs) == device
        return same_device and (first is None or str(first.dtype) in dtypes)

    def _follow_move(self) -> None:
        """The model moved or was cast since its ORT session was built: rebuild it, so that what ORT
        runs (ort_hf's CPU kernels, padding rewrites, thread settings) is chosen for where it is now,
        and check the new graph before training as the first one was."""
        before, exported = self._settings.device_type, self._record.export_count
        self.reconfigure(self.options)
        self._run.checked = False
        (logger.warning if exported else logger.info)(
            "ort_hf: %s moved (%s to %s) or changed dtype after it was wrapped: its ORT session is rebuilt for where it "
            "is now%s.",
            type(self.module).__name__,
            before,
            self._settings.device_type,
            " (one more export)" if exported else "",
        )

    def forward(self, *args, **kwargs):
        settings, run = self._settings, self._run
        if run.use_pytorch or (not self.training and not settings.options.eval_in_ort):
            return self.module(*args, **kwargs)
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            args, kwargs = (), dict(args[0])  # ORTModule rejects BatchEncoding; plain dict it is
        if self.training and not self._placed_as_built(args, kwargs):
            self._follow_move()
            settings = self._settings
        if self.training and settings.disable_cache:
            kwargs.setdefault("use_cache", False)
        target_side = decoder_side(kwargs, settings.targets_apart) if self.training else set()
        if self.training and settings.trim_padding:
            # ORT's padding elimination exists only in its CUDA build: on CPU the columns that are
            # padding in every row are dropped here, which leaves the loss unchanged.
            trimmed, kept, total = trim_trailing_padding(without(kwargs, target_side))
            kwargs = {k: trimmed.get(k, v) for k, v in kwargs.items()}  # the caller's order: ORT's input schema
            if total > 0:
                rows = kwargs["attention_mask"].shape[0]
                self.padding_stats["kept_tokens"] += kept * rows
                self.padding_stats["total_tokens"] += total * rows
        if self.training:
            self._check_padding_elimination(without(kwargs, target_side))
        if not run.ran:
            check_precision(self.module)  # refused loudly, never a fallback
        set_custom_autograd(settings.pythonop)
        token = ACTIVE_EXPORT_RECORD.set(self._record)
        try:
            if self.training and not run.checked:
                self._first_training_step(args, kwargs)
            if self.training and self._step_seed is not None:
                seed, step, forwards = self._step_seed
                self.reseed(seed * 1_000_003 + step * 1_009 + forwards)
                self._step_seed[2] += 1
            with self._trainable_check():
                output = self._run_ort(args, kwargs)
        except Exception as exc:
            if run.ran or isinstance(exc, ORTFallbackError):
                raise  # ORT ran before: a runtime error, not something a fallback should hide
            if settings.options.fallback == "disable":
                raise ORTFallbackError(
                    f"ORT could not run {type(self.module).__name__} and fallback is disabled: "
                    f"{describe_failure(exc)}. Set fallback='auto' to train it in PyTorch instead."
                ) from exc
            # ORT's own fallback covers export failures only; a failure building the gradient
            # graph or the session arrives here. Same policy: say why once, train in PyTorch.
            self._record_fallback(describe_failure(exc))
            run.use_pytorch = True
            return self.module(*args, **kwargs)
        finally:
            ACTIVE_EXPORT_RECORD.reset(token)
        self._note_backend()
        return output

    def _first_training_step(self, args: tuple, kwargs: dict) -> None:
        """Say which rewrites run and why, and run the pre-flight where it is wanted."""
        settings, name = self._settings, model_class_name(self.module)
        self._run.checked = True
        refuse_layer_drop(self.module)
        unproven, line = rewrites_line(name, settings, self._record.kernel_swaps)
        (logger.warning if unproven else logger.info)("%s", line)
        if not settings.preflight:
            return
        logger.warning(
            "ort_hf: %s is not among the classes the architecture sweep proved exact: checking ORT's graph "
            "against PyTorch on the first batch before training (--ort_preflight never skips this).",
            name,
        )
        # The check's own session: fallback disabled (a failure is the answer), no rewrite and no
        # export cache (its graph is built with dropout off and must never serve the real run).
        check = dataclasses.replace(
            settings.options,
            fallback="disable",
            preflight="never",
            trim_padding=False,
            eliminate_padding=False,
            export_cache_dir=None,
            save_onnx=False,
            onnx_dir=None,
            profile_dir=None,
            mem_efficient_grad_mgmt=False,
        )
        summary = run_preflight(self.module, lambda m: wrap_model(m, check), args, kwargs)
        logger.info("ort_hf: pre-flight of %s: %s.", name, summary)

    def _check_padding_elimination(self, inputs: dict) -> None:
        """Ask for padding elimination if this batch builds a graph and gains from it; refuse a batch
        the graph built with it would train wrongly (left padding, or labels on padding positions)."""
        record = self._record
        if record.padding_rewrite is not None and not padding_unread(inputs):
            raise ValueError(
                "ort_hf: this batch is padded on the left or labels padding positions (attention_mask 0, label "
                "not -100), but ORT's graph runs with padding elimination, which computes nothing at padding "
                "positions. Pad on the right with padding labelled -100 (as DataCollatorWithPadding and "
                "DataCollatorForLanguageModeling do), or train with --ort_eliminate_padding false "
                "(ORTOptions(eliminate_padding=False))."
            )
        record.eliminate_padding = self._settings.eliminate_padding and worth_eliminating(inputs)

    @property
    def padding_rewrite(self):
        """What padding elimination changed in the training graph built last (None: not applied)."""
        return self._record.padding_rewrite

    def _trainable_check(self):
        """ORT's gradient graph outputs gradients for the parameters that required grad when it was
        built; when that changed since the last training step (a layer unfrozen or frozen), ORT
        compares again and rebuilds its graph on this step (compat.recheck_trainable)."""
        if not self.training:
            return contextlib.nullcontext()
        trainable = tuple(p.requires_grad for p in self.module.parameters())
        changed = self._run.trainable is not None and trainable != self._run.trainable
        self._run.trainable = trainable
        return compat.recheck_trainable(self._training_manager()) if changed else contextlib.nullcontext()

    def _run_ort(self, args, kwargs):
        """ORT's forward, with the buffers ``forward`` writes kept as PyTorch keeps them (state_sync)."""
        stateful = self._run.stateful
        if stateful is not None:
            saved = stateful.snapshot()
            output, written, stats = self._ort(*args, **{BUFFERS_ARG: stateful.buffer_inputs()}, **kwargs)
            # Undone: an export's Python forwards, and ORT's BatchNormalization, which can write its
            # running statistics in place into the buffer memory it shares with PyTorch.
            restore_buffers(self.module, saved)
            if self.training:
                stateful.apply(written, stats)
            return output
        if self._run.ran or not self.training:
            return self._ort(*args, **kwargs)
        watch = StateWatch(self.module)
        output = self._ort(*args, **kwargs)
        watch.report_python_state()
        written = watch.written_buffers()
        if not written or self._ort._fallback_manager.is_pending():
            return output
        watch.restore()
        logger.info(
            "ort_hf: forward writes buffers (%s); they are carried through the ORT graph and updated "
            "after every step as in PyTorch (re-exporting once).",
            ", ".join(written),
        )
        self._run.stateful = StatefulForward(self.module, written)
        self._set_ort(build_ort_module(self._run.stateful, self.options, ensure_engine()))
        self._ort.train(self.training)
        return self._run_ort(args, kwargs)

    def _note_backend(self) -> None:
        first = not self._run.ran
        self._run.ran = True
        if first and self.training and self.training_graph() is not None:
            self._check_requested_plans()
            logger.info(
                "ort_hf: ORT's training graph of %s: nodes swapped for ort_hf's kernels: %s.",
                type(self.module).__name__,
                self._record.swapped or "none",
            )
        manager = self._ort._fallback_manager
        if self._run.fallback_reason is None and manager.is_pending():
            self._record_fallback(describe_failure(manager._exception))

    def _record_fallback(self, reason: str) -> None:
        self._run.ran, self._run.fallback_reason = True, reason
        logger.warning(
            "ort_hf: ORT could not run %s; training continues in PyTorch. Reason: %s",
            type(self.module).__name__,
            reason,
        )

    def use_pytorch(self, enabled: bool = True) -> None:
        """Run the next training forwards in PyTorch (``True``) or through the ORT session again
        (``False``); session and weights stay as they are (to time PyTorch steps inside a run)."""
        if self._run.fallback_reason is None:
            self._run.use_pytorch = enabled

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
        target = self._run.stateful if self._run.stateful is not None else self.module
        self._set_ort(build_ort_module(target, options, state))
        self._settings = WrapSettings.of(self.module, options, state)
        self._built_for = self._placement()
        self._record.configure(options, self._settings.device_type)
        self._run.ran = False
        self._ort.train(self.training)

    def release(self) -> None:
        """Drop the ORT session (and its buffers) of a module that will not run again, e.g. the
        one replaced when ``auto_find_batch_size`` retries with a smaller batch."""
        self._set_ort(None)
        release_kernel_buffers()
        release_freed_memory()

    def seed_steps(self, seed: int, step: int) -> None:
        """Seed the graph's random generators before each following training forward from ``(seed,
        step, n)``, ``n`` counting the forwards since this call: dropout masks are then a function of
        the optimizer step and the micro-batch, and a run resumed at ``step`` draws the masks an
        uninterrupted run drew. ``ORTTrainer`` calls it at every optimizer step, whatever
        ``compute_loss`` or ``training_step`` its subclass runs; a ``wrap_model`` user calls it before
        each step. Without it the masks come from one process-wide stream (:meth:`reseed`)."""
        self._step_seed = [int(seed), int(step), 0]

    def reseed(self, seed: int) -> None:
        """Seed the random generators of the ORT graph: ORT's own and that of ort_hf's CPU dropout
        kernels (``cpu_kernel_swaps``), which draw the dropout masks inside the graph.

        Neither is part of torch's RNG state, so the Trainer's checkpoints cannot restore them;
        seeding them from (seed, step) makes masks a function of the step, so a resumed run draws
        the same masks as an uninterrupted one."""
        import onnxruntime
        import torch

        onnxruntime.set_seed(seed % (2**63))
        if hasattr(torch.ops.ort_hf, "set_dropout_seed"):
            torch.ops.ort_hf.set_dropout_seed(seed % (2**63))

    def engine_status(self) -> EngineStatus:
        run = self._run
        if not run.ran:
            backend = "not_run"
        elif run.fallback_reason is not None or self._ort is None:
            backend = "pytorch"
        else:
            backend = "ort"
        return EngineStatus(
            backend=backend,
            fallback_reason=run.fallback_reason,
            export_count=self._record.export_count,
            export_seconds=self._record.export_seconds,
            pythonop=self._settings.pythonop,
            swapped=dict(self._record.swapped or {}),
        )


def wrap_model(model: nn.Module, options: ORTOptions | None = None) -> ORTTrainingModule:
    """Return a module that trains ``model`` through ONNX Runtime's ORTModule.

    The model keeps its parameters (an optimizer built on ``model.parameters()`` steps the
    weights ORT trains). Check ``engine_status()`` after the first training step to see
    whether ORT executed or fell back to PyTorch.
    """
    options = options or ORTOptions()
    state = ensure_engine()
    register_symbolics(state, options.opset_version)
    apply_trace_fixes(model)  # before ORT's first (and only) trace
    return ORTTrainingModule(model, build_ort_module(model, options, state), options, state)
