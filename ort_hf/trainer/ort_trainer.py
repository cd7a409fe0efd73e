"""ORTTrainer: transformers.Trainer that trains through ONNX Runtime's ORTModule.

It overrides narrow hooks only (``_wrap_model``, ``compute_loss``, ``get_optimizer_cls_and_kwargs``,
``log``, ``_get_train_sampler``, ``_save``) and checks around ``train``; the training loop,
checkpointing, resume, evaluation and callbacks are the parent's. ``self.model`` stays the plain
Hugging Face model, so saved checkpoints are ordinary HF checkpoints.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.training_args import ParallelMode

from ..callbacks import BatchObserver, InputDensityCallback, MemoryObserverCallback
from ..engine import INFERENCE_OPSET, ORTOptions, fused_adamw_cls_and_kwargs, loss_as_trainer_returns, wrap_model
from ..module_with_loss import ModuleWithLoss
from ..module_with_loss.fused_lm_head import FusedHeadCaller, FusedLMHeadModule
from ..module_with_loss.module_with_loss import LossInPyTorch
from ..trl.fused_head import fused_head_of
from .bypass_check import EngineBypassCheck
from .checks import (
    check_output_dir_writable,
    check_token_ids,
    check_train_dataset,
    checkpoint_problem,
    host_check_due,
    last_complete_checkpoint,
    unfinished_checkpoint_guard,
    warn_if_not_finite,
)
from .deepspeed import prepare_deepspeed
from .first_step import first_step_facts, place_loss
from .neftune import use_exportable_neftune
from .parent_binding import bind_trainer_arguments, parent_init
from .run_state import ORTRunState
from .step_seed import StepSeedCallback
from .training_args import ADAMW_ORT_FUSED, recompute_level_for_checkpointing

logger = logging.getLogger(__name__)


class ORTTrainerMixin:
    """The ORT hooks, for ``Trainer`` and its subclasses (``ORTTrainer``, ``ORTSeq2SeqTrainer``).

    Training steps run in an ORT session; evaluation and prediction (generation included) run
    the plain model in PyTorch unless ``ort_eval_in_ort``.
    """

    # The arguments class the parent gets; None: the parent's own config class with the ORT options
    # added (parent_binding.ort_args_class_for: ORTTrainingArguments for Trainer, ORTSFTConfig for SFTTrainer).
    ort_args_class: type | None = None

    def __init__(self, *args, **kwargs):
        # Bound to the parent's own signature (DPOTrainer's second parameter is ref_model, not args).
        args, kwargs = bind_trainer_arguments(parent_init(self, ORTTrainerMixin), self.ort_args_class, args, kwargs)
        super().__init__(*args, **kwargs)
        self._ort_run = ORTRunState()
        self._fused_head = fused_head_of(self.model, self.args)  # TRL's fused LM head (SFTTrainer, DPOTrainer...)
        # A Trainer subclass with its own compute_loss (class weights, a focal loss, a reward model's
        # pairwise loss), below the mixin or above it (a user's class over an ORT trainer), keeps it:
        # ORT runs the model's forward and backward, that compute_loss turns the outputs into the
        # loss, and ModuleWithLoss (label sparsity) stays out. So it does under a training_step that
        # does not go through the parent's (it may call the model itself, expecting its own outputs).
        self._parent_loss = _own_override(type(self), "compute_loss") or _step_of_its_own(type(self))
        if self.args.use_ort and self.args.use_module_with_loss and self._fused_head is None and self._parent_loss:
            logger.info(
                "ort_hf: %s computes the loss from the ORT model's outputs; ModuleWithLoss (label sparsity) "
                "is off for it.",
                self._parent_loss,
            )
        self._add_default_callbacks()

    def _add_default_callbacks(self) -> None:
        if self.args.use_ort:
            self.add_callback(StepSeedCallback(self))
            overrides = " / ".join(
                filter(None, (_own_override(type(self), n) for n in ("training_step", "compute_loss")))
            )
            if overrides:  # they run ORT only if they call the model they are given
                self.add_callback(EngineBypassCheck(self, overrides))
        present = {type(cb) for cb in self.callback_handler.callbacks}
        if self.args.ort_density_callback and InputDensityCallback not in present:
            self.add_callback(InputDensityCallback(print_every=self.args.ort_density_print_every))
        if self.args.ort_memory_callback and MemoryObserverCallback not in present:
            self.add_callback(MemoryObserverCallback())
        if self.args.use_ort and self.args.ort_memory_budget_mb:
            from .budget import MemoryBudgetController

            observer = next(cb for cb in self.callback_handler.callbacks if isinstance(cb, MemoryObserverCallback))
            self.add_callback(MemoryBudgetController(self, self.args.ort_memory_budget_mb, observer))
        if self.args.use_ort and self.args.ort_compare_steps:
            from .break_even import BreakEvenCallback

            self.add_callback(BreakEvenCallback(self, self.args.ort_compare_steps))

    def _observers(self) -> list[BatchObserver]:
        return [cb for cb in self.callback_handler.callbacks if isinstance(cb, BatchObserver)]

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """As ``Trainer.train``; ``resume_from_checkpoint=True`` picks the newest checkpoint that
        was completely written (a save killed half-way is skipped, never loaded)."""
        check_train_dataset(self.train_dataset)
        if self.args.should_save and self.args.save_strategy != "no":
            check_output_dir_writable(self.args.output_dir)  # before hours of training, not at the first save
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No intact checkpoint found in {self.args.output_dir} to resume from.")
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)) and os.path.isdir(resume_from_checkpoint):
            problem = checkpoint_problem(resume_from_checkpoint)
            if problem:
                intact = last_complete_checkpoint(os.path.dirname(os.path.abspath(resume_from_checkpoint)))
                raise ValueError(
                    f"Cannot resume from {resume_from_checkpoint}: {problem}. The newest intact checkpoint "
                    f"next to it is {intact or 'none'}; pass that, or resume_from_checkpoint=True."
                )
        # A checkpoint write that fails (full or read-only disk) ends with one message saying
        # which checkpoint is intact and how to resume.
        self._ort_run.start_train_call(resumed=bool(resume_from_checkpoint))
        with unfinished_checkpoint_guard(self.args.output_dir, lambda: self.state.global_step, self.args.should_save):
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        profile = self._ort_run.engine.end_profiling() if self._ort_run.engine is not None else None
        if profile:
            logger.warning(
                "ort_hf: ORT's per-node profile of this training run: %s (open it in chrome://tracing "
                "or https://ui.perfetto.dev)",
                profile,
            )
        return output

    # --- model wrapping -------------------------------------------------------------------
    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader=None) -> nn.Module:
        if not self.args.use_ort:
            return super()._wrap_model(model, training, dataloader)
        if not training:
            if self.args.ort_eval_in_ort:
                return self._ort_eval_model()
            return super()._wrap_model(model, training, dataloader)
        # Called once per training attempt by the parent loop (again only when
        # auto_find_batch_size retries with a smaller batch, when a fresh session is wanted).
        if getattr(self, "neftune_hook_handle", None) is not None:
            self.neftune_hook_handle = use_exportable_neftune(self.model, self.neftune_hook_handle)
        run = self._ort_run
        new_call, run.new_train_call = run.new_train_call, False
        options = self._training_options()
        if new_call and self._can_reuse_engine(options):
            return run.train_model  # a later train() on the same model and options: no re-export
        if run.engine is not None:
            run.engine.release()  # a retry (auto_find_batch_size): free the old session first
        if self.is_deepspeed_enabled:
            # transformers leaves this move to DeepSpeed, which makes it after we wrap: the engine
            # wraps the model where it will train (a later cast by DeepSpeed rebuilds the session).
            self.model.to(self.args.device)
        engine_module = wrap_model(self._training_target(), options)
        run.engine, run.first_step_due = engine_module, True
        for observer in self._observers():
            observer.observe(engine_module)  # the batch reaches the engine module, not the HF model
        wrapped: nn.Module = engine_module
        if self.is_deepspeed_enabled:
            wrapped = prepare_deepspeed(self, engine_module)  # ZeRO-1/2 outside, ORTModule inside
        elif self.args.parallel_mode == ParallelMode.DISTRIBUTED:
            wrapped = self.accelerator.prepare_model(engine_module)  # DDP outside, ORTModule inside
        run.train_model = wrapped
        return wrapped

    def _can_reuse_engine(self, options: ORTOptions) -> bool:
        engine, loss_module = self._ort_run.engine, self._ort_run.loss_module
        if engine is None or self.is_deepspeed_enabled or self.args.parallel_mode == ParallelMode.DISTRIBUTED:
            return False
        wrapper = engine.module is loss_module and loss_module is not None
        target = engine.module.model if wrapper else engine.module
        wants_wrapper = self._loss_in_module_with_loss or self._fused_head is not None
        return (
            target is self.model
            and engine.options == options
            and engine.engine_status().backend == "ort"
            and wrapper == wants_wrapper
        )

    @property
    def _loss_in_module_with_loss(self) -> bool:
        """ModuleWithLoss computes Trainer's loss in the engine: asked for, and no parent's own loss."""
        return self.args.use_module_with_loss and self._parent_loss is None

    def _training_target(self) -> nn.Module:
        run = self._ort_run
        if self._fused_head is not None:
            # TRL's trainer calls the model for its fused head: exported as plain ops, on the used rows only.
            run.loss_module = FusedLMHeadModule(self.model, self._fused_head)
            return run.loss_module
        if not self._loss_in_module_with_loss:
            run.loss_module = None
            return self.model
        run.loss_module = ModuleWithLoss(
            self.model,
            label_smoothing=self.args.label_smoothing_factor,
            # transformers' flag misses causal LMs whose loss_type is unset (GPT2LMHeadModel):
            # when it says False, ModuleWithLoss decides from the model's class.
            shift_labels=True if self._loss_shifts_labels else None,
            compute_loss_func=self.compute_loss_func,
            model_accepts_loss_kwargs=self.model_accepts_loss_kwargs,
        )
        return run.loss_module

    def _training_options(self) -> ORTOptions:
        options = self.args.ort_options()
        if self.args.ort_memory_budget_mb:
            from .budget import START_LEVEL

            # Budget mode starts on the heaviest rung and lightens from there (budget.py).
            options = dataclasses.replace(options, memory_opt_level=START_LEVEL, memory_opt_plans=())
        if getattr(self.model, "is_activation_checkpointing", False):  # enabled on the model itself
            logger.warning("ort_hf: gradient checkpointing on the model is replaced by ORT layer-wise recompute.")
            self.model.activation_checkpointing_disable()
            level = recompute_level_for_checkpointing(options.memory_opt_level, options.memory_opt_plans)
            options = dataclasses.replace(options, memory_opt_level=level)
        return options

    def _ort_eval_model(self) -> nn.Module:
        run = self._ort_run
        if run.eval_engine is None or run.eval_engine.module is not self.model:
            run.eval_engine = wrap_model(self.model, dataclasses.replace(self.args.ort_options(), eval_in_ort=True))
        return run.eval_engine

    @property
    def ort_engine(self):
        """The ORT training module (``ORTTrainingModule``) of the current ``train()`` attempt, or
        None when training has not started or does not use ORT."""
        return self._ort_run.engine

    def add_ort_logs(self, logs: dict[str, float]) -> None:
        """Values for the next training log, once: facts about this run's graph (callbacks add theirs)."""
        self._ort_run.pending_logs.update(logs)

    def ort_engine_status(self):
        """What ran the last training attempt (``EngineStatus``), or None when ORT was not used."""
        return None if self._ort_run.engine is None else self._ort_run.engine.engine_status()

    def export_onnx(
        self, output_dir: str, sample_inputs: dict | None = None, opset_version: int = INFERENCE_OPSET
    ) -> str:
        """Write an inference ONNX model of the trained model (every tensor it outputs, by name:
        ``logits``, or ``start_logits`` / ``end_logits``, ...) plus its config and tokenizer files
        to ``output_dir``; each output is checked in onnxruntime against PyTorch's (atol 1e-4)
        before this returns. ``sample_inputs`` defaults to one batch of the
        eval (or train) dataset; the inputs the trainer treats as labels (``label_names``, the
        model's label arguments such as ``start_positions``) are left out, and an encoder-decoder gets
        the ``decoder_input_ids`` of its labels. ``opset_version`` is the inference model's ONNX opset; it is not
        ``--ort_opset_version``, which is the training export's (16, for ORT's optimiser)."""
        from .onnx_export import export_trained_onnx

        return export_trained_onnx(self, output_dir, sample_inputs, opset_version)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # Under DeepSpeed the parent reads the weights through DeepSpeed's engine, whose module is
        # the ORT wrapper (keys would carry its prefixes). ZeRO-1/2 keep every weight whole in
        # self.model: its own state dict is the plain HF checkpoint.
        if self.is_deepspeed_enabled and self.args.use_ort:
            state_dict = None
        super()._save(output_dir, state_dict)

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        # The parent relies on accelerate, which applies --fp16/--bf16 by wrapping the forward of
        # the model it prepares; ORT's engine module is not prepared (the PyTorch model is ORT's
        # input), so the autocast goes around the step instead: ORT exports the autocast graph.
        if self.args.use_ort and (self.args.fp16 or self.args.bf16):
            return self.accelerator.autocast(autocast_handler=None)
        return super().autocast_smart_context_manager(cache_enabled)

    # --- loss ------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """On an ORT training step, the loss ``Trainer.compute_loss`` returns, computed by the engine
        (TRL's fused head: the parent's ``compute_loss``, calling the engine); otherwise the parent's."""
        run = self._ort_run
        if return_outputs or model is None or model is not run.train_model or run.loss_module is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels, ids = inputs.get("labels"), inputs.get("input_ids")
        checked = host_check_due(
            ids.device.type if torch.is_tensor(ids) else "cpu", self.state.global_step, self.state.logging_steps or 0
        )
        if checked:
            check_token_ids(inputs, getattr(getattr(self.model, "config", None), "vocab_size", None))
        if run.first_step_due:  # before the first forward: the placement decides what ORT exports
            run.pending_logs.update(
                place_loss(run.loss_module, inputs, num_items_in_batch, self.args, run.engine.engine_status().pythonop)
            )
        try:
            loss = self._engine_loss(model, inputs, num_items_in_batch)
        except RuntimeError as exc:
            last = last_complete_checkpoint(self.args.output_dir)
            raise RuntimeError(
                f"ORT failed at step {self.state.global_step + 1}: {exc}\n"
                f"Last complete checkpoint: {last or 'none yet'} (resume with resume_from_checkpoint=True)."
            ) from exc
        if checked:
            warn_if_not_finite(loss, labels, self.state.global_step + 1)
        if run.first_step_due:
            run.first_step_due = False
            run.pending_logs.update(first_step_facts(run.engine, run.loss_module, run.head_caller, labels, self.args))
        return loss

    def _engine_loss(self, model, inputs: dict, num_items_in_batch) -> torch.Tensor:
        run = self._ort_run
        if isinstance(run.loss_module, FusedLMHeadModule):
            # TRL's compute_loss builds its loss and metrics from the fused head's outputs; it calls the engine.
            run.head_caller = FusedHeadCaller(model, no_grad_model=self.model)
            return super().compute_loss(run.head_caller, inputs, False, num_items_in_batch)
        # ModuleWithLoss computes the loss Trainer.compute_loss would (the label smoother's,
        # compute_loss_func's or the model's own, normalised by num_items_in_batch where the
        # Trainer's is); the parent's handling of that loss is applied after.
        module: ModuleWithLoss = run.loss_module
        if num_items_in_batch is not None and module.takes_num_items:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        loss = (model if module.loss_in_graph else LossInPyTorch(model, module))(**inputs)["loss"]
        return loss_as_trainer_returns(self, loss, num_items_in_batch)

    # --- data ------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None):
        if not (self.args.use_ort and self.args.ort_load_balancing_sampler):
            return super()._get_train_sampler(train_dataset)
        from ..engine import LoadBalancingBatchSampler

        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return LoadBalancingBatchSampler(
            dataset,
            self.args.per_device_train_batch_size,
            self.args.world_size,
            self.args.process_index,
            self.args.seed,
        )

    # --- optimizer -------------------------------------------------------------------------
    @staticmethod
    def get_optimizer_cls_and_kwargs(args: TrainingArguments, model=None):
        if args.optim != ADAMW_ORT_FUSED:
            return Trainer.get_optimizer_cls_and_kwargs(args, model)
        return fused_adamw_cls_and_kwargs(
            args.device.type, args.learning_rate, (args.adam_beta1, args.adam_beta2), args.adam_epsilon
        )

    # --- logging ---------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            run = self._ort_run
            if run.facts_due and self.args.ort_log_facts:
                # One-time facts of this run's graph: in the original run's first log only, so a
                # resumed run's log_history is the uninterrupted one's.
                logs.update(run.pending_logs)
            run.pending_logs = {}
            stats = run.engine.padding_stats if run.engine is not None and self.args.ort_log_facts else {}
            if stats.get("total_tokens"):  # share of token positions ORT computed, so far
                logs["ort/positions_kept"] = round(stats["kept_tokens"] / stats["total_tokens"], 4)
            # Collected here, before the parent logs, so trainer_state.json and every
            # report_to integration get the callbacks' numbers whatever the callback order.
            for observer in self._observers():
                observer.merge_into(self.args, self.state, logs)
        super().log(logs, start_time)


def _own_override(cls: type, name: str) -> str | None:
    """The qualified name of the first ``name`` in ``cls``'s MRO that is neither Trainer's nor the mixin's."""
    for klass in cls.__mro__:
        if name in vars(klass) and klass not in (ORTTrainerMixin, Trainer):
            return vars(klass)[name].__qualname__
        if klass is Trainer:
            return None
    return None


def _step_of_its_own(cls: type) -> str | None:
    """The qualified name of a ``training_step`` in ``cls``'s MRO that does not call ``super().training_step``
    (read from its code's names), before Trainer's; None when every override passes on to the parent's."""
    for klass in cls.__mro__:
        if klass is Trainer:
            return None
        step = vars(klass).get("training_step")
        if step is None or klass is ORTTrainerMixin:
            continue
        names = getattr(getattr(inspect.unwrap(step), "__code__", None), "co_names", ())
        if not {"super", "training_step"} <= set(names):
            return step.__qualname__
    return None


class ORTTrainer(ORTTrainerMixin, Trainer):
    """Drop-in ``Trainer`` whose training steps run in an ORT session."""
