"""ORTTrainer: transformers.Trainer that trains through ONNX Runtime's ORTModule.

It overrides narrow hooks only (``_wrap_model``, ``compute_loss``, ``get_optimizer_cls_and_kwargs``,
``log``, ``_get_train_sampler``, ``_save``) and checks around ``train``; the training loop,
checkpointing, resume, evaluation and callbacks are the parent's. ``self.model`` stays the plain
Hugging Face model, so saved checkpoints are ordinary HF checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.training_args import ParallelMode

from ..callbacks import BatchObserver, InputDensityCallback, MemoryObserverCallback
from ..engine import INFERENCE_OPSET, SPARSITY_THRESHOLD, ORTOptions, fused_adamw_cls_and_kwargs, wrap_model
from ..module_with_loss import ModuleWithLoss
from ..module_with_loss.loss_choice import choose_loss
from ..module_with_loss.module_with_loss import CROSS_ENTROPY, LossInPyTorch
from .checks import (check_output_dir_writable, check_token_ids, check_train_dataset, checkpoint_problem,
                     host_check_due, last_complete_checkpoint, unfinished_checkpoint_guard)
from .deepspeed import prepare_deepspeed
from .step_seed import StepSeedCallback
from .neftune import use_exportable_neftune
from .first_step import record_memory_plans, why_no_label_sparsity
from ..module_with_loss.fused_lm_head import FusedHeadCaller, FusedLMHeadModule, fused_head_of, head_rows_report
from .trainer_args import bind_trainer_arguments, parent_init
from .training_args import ADAMW_ORT_FUSED, recompute_level_for_checkpointing

logger = logging.getLogger(__name__)

class ORTTrainerMixin:
    """The ORT hooks, for ``Trainer`` and its subclasses (``ORTTrainer``, ``ORTSeq2SeqTrainer``).

    Training steps run in an ORT session; evaluation and prediction (generation included) run
    the plain model in PyTorch unless ``ort_eval_in_ort``.
    """

    # The arguments class the parent gets; None: the parent's own config class with the ORT options
    # added (trainer_args.ort_args_class_for: ORTTrainingArguments for Trainer, ORTSFTConfig for SFTTrainer).
    ort_args_class: type | None = None

    def __init__(self, *args, **kwargs):
        # Bound to the parent's own signature (DPOTrainer's second parameter is ref_model, not args).
        args, kwargs = bind_trainer_arguments(parent_init(self, ORTTrainerMixin), self.ort_args_class, args, kwargs)
        super().__init__(*args, **kwargs)
        self._ort_engine_module = None  # the ORTTrainingModule of the current train() attempt
        self._ort_train_model = None  # what _wrap_model returned (DDP outside it when distributed)
        self._ort_eval_module = None
        self._pending_ort_logs: dict[str, float] = {}
        self._ort_facts_due = True  # False in a run resumed from a checkpoint
        self._ort_new_train_call = False  # the next _wrap_model starts a train() call (not a retry)
        self._loss_module: ModuleWithLoss | None = None  # inside the engine module when use_module_with_loss
        self._label_sparsity_checked = False
        self._fused_head = fused_head_of(self.model, self.args)  # TRL's fused LM head (SFTTrainer, DPOTrainer...)
        self._add_default_callbacks()

    def _add_default_callbacks(self) -> None:
        if self.args.use_ort:
            self.add_callback(StepSeedCallback(self))
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
                raise ValueError(f"Cannot resume from {resume_from_checkpoint}: {problem}. The newest intact checkpoint "
                                 f"next to it is {intact or 'none'}; pass that, or resume_from_checkpoint=True.")
        # A checkpoint write that fails (full or read-only disk) ends with one message saying
        # which checkpoint is intact and how to resume.
        self._ort_facts_due = not resume_from_checkpoint
        self._ort_new_train_call = True
        with unfinished_checkpoint_guard(self.args.output_dir, lambda: self.state.global_step, self.args.should_save):
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        profile = self._ort_engine_module.end_profiling() if self._ort_engine_module is not None else None
        if profile:
            logger.warning("ort_hf: ORT's per-node profile of this training run: %s (open it in chrome://tracing "
                           "or https://ui.perfetto.dev)", profile)
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
        new_call, self._ort_new_train_call = self._ort_new_train_call, False
        options = self._training_options()
        if new_call and self._can_reuse_engine(options):
            return self._ort_train_model  # a later train() on the same model and options: no re-export
        if self._ort_engine_module is not None:
            self._ort_engine_module.release()  # a retry (auto_find_batch_size): free the old session first
        if self.is_deepspeed_enabled:
            # transformers leaves this move to DeepSpeed, which makes it after we wrap: the engine
            # wraps the model where it will train (a later cast by DeepSpeed rebuilds the session).
            self.model.to(self.args.device)
        engine_module = wrap_model(self._training_target(), options)
        self._ort_engine_module = engine_module
        self._label_sparsity_checked = False
        for observer in self._observers():
            observer.observe(engine_module)  # the batch reaches the engine module, not the HF model
        wrapped: nn.Module = engine_module
        if self.is_deepspeed_enabled:
            wrapped = prepare_deepspeed(self, engine_module)  # ZeRO-1/2 outside, ORTModule inside
        elif self.args.parallel_mode == ParallelMode.DISTRIBUTED:
            wrapped = self.accelerator.prepare_model(engine_module)  # DDP outside, ORTModule inside
        self._ort_train_model = wrapped
        return wrapped

    def _can_reuse_engine(self, options: ORTOptions) -> bool:
        engine = self._ort_engine_module
        if engine is None or self.is_deepspeed_enabled or self.args.parallel_mode == ParallelMode.DISTRIBUTED:
            return False
        wrapper = engine.module is self._loss_module and self._loss_module is not None
        target = engine.module.model if wrapper else engine.module
        wants_wrapper = self.args.use_module_with_loss or self._fused_head is not None
        return (target is self.model and engine.options == options and engine.engine_status().backend == "ort"
                and wrapper == wants_wrapper)

    def _training_target(self) -> nn.Module:
        if self._fused_head is not None:
            # TRL's trainer calls the model for its fused head: exported as plain ops, on the used rows only.
            self._loss_module = FusedLMHeadModule(self.model, self._fused_head)
            return self._loss_module
        if not self.args.use_module_with_loss:
            self._loss_module = None
            return self.model
        self._loss_module = ModuleWithLoss(
            self.model,
            label_smoothing=self.args.label_smoothing_factor,
            # transformers' flag misses causal LMs whose loss_type is unset (GPT2LMHeadModel):
            # when it says False, ModuleWithLoss decides from the model's class.
            shift_labels=True if self._loss_shifts_labels else None,
            compute_loss_func=self.compute_loss_func,
            model_accepts_loss_kwargs=self.model_accepts_loss_kwargs,
        )
        return self._loss_module

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
        if self._ort_eval_module is None or self._ort_eval_module.module is not self.model:
            options = dataclasses.replace(self.args.ort_options(), eval_in_ort=True)
            self._ort_eval_module = wrap_model(self.model, options)
        return self._ort_eval_module

    @property
    def ort_engine(self):
        """The ORT training module (``ORTTrainingModule``) of the current ``train()`` attempt, or
        None when training has not started or does not use ORT."""
        return self._ort_engine_module

    def add_ort_logs(self, logs: dict[str, float]) -> None:
        """Values for the next training log, once: facts about this run's graph (callbacks add theirs)."""
        self._pending_ort_logs.update(logs)

    def ort_engine_status(self):
        """What ran the last training attempt (``EngineStatus``), or None when ORT was not used."""
        return None if self._ort_engine_module is None else self._ort_engine_module.engine_status()

    def export_onnx(self, output_dir: str, sample_inputs: dict | None = None,
                    opset_version: int = INFERENCE_OPSET) -> str:
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
        through_engine = (
            model is self._ort_train_model and model is not None and self._loss_module is not None
        ) and not return_outputs
        if not through_engine:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs.get("labels")
        ids = inputs.get("input_ids")
        checked = host_check_due(ids.device.type if torch.is_tensor(ids) else "cpu", self.state.global_step,
                                 self.state.logging_steps or 0)
        if checked:
            check_token_ids(inputs, getattr(getattr(self.model, "config", None), "vocab_size", None))
        if not self._label_sparsity_checked:
            self._place_loss(inputs, num_items_in_batch)  # before the first forward: it decides what ORT exports
        try:
            loss = self._compute_loss_through_engine(model, inputs, num_items_in_batch)
        except RuntimeError as exc:
            last = last_complete_checkpoint(self.args.output_dir)
            raise RuntimeError(
                f"ORT failed at step {self.state.global_step + 1}: {exc}\n"
                f"Last complete checkpoint: {last or 'none yet'} (resume with resume_from_checkpoint=True)."
            ) from exc
        if checked and not torch.isfinite(loss.detach()).all():
            why = ""
            if isinstance(labels, torch.Tensor) and not labels.is_floating_point() and bool((labels == -100).all()):
                why = (" Every label of this batch is -100 (ignored): a mean over no labelled token is NaN, in "
                       "PyTorch as in ORT; drop such rows (e.g. truncation that cut every answer token) or check "
                       "the collator's label masking.")
            logger.warning("ort_hf: non-finite loss %s at step %d (the logged loss filters it when "
                           "logging_nan_inf_filter is on, as the Trainer does).%s", loss.item(),
                           self.state.global_step + 1, why)
        if not self._label_sparsity_checked:
            self._report_first_step(labels)
        return loss

    def _compute_loss_through_engine(self, model, inputs: dict, num_items_in_batch):
        module = self._loss_module
        if isinstance(module, FusedLMHeadModule):
            # The parent's own compute_loss (TRL's), calling the engine for its fused head.
            self._fused_caller = FusedHeadCaller(model)
            return super().compute_loss(self._fused_caller, inputs, False, num_items_in_batch)
        if num_items_in_batch is not None and module.takes_num_items:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        # ModuleWithLoss computes what the parent would (label smoothing, compute_loss_func, the
        # model's loss); the parent only reads outputs["loss"] and scales it across devices under
        # the condition it would use for that loss.
        hooks = {"label_smoother": None, "compute_loss_func": None,
                 "model_accepts_loss_kwargs": self.model_accepts_loss_kwargs or self.compute_loss_func is not None}
        runner = model if module.loss_in_graph else LossInPyTorch(model, module)
        with _replaced(self, **hooks):
            return super().compute_loss(runner, inputs, False, num_items_in_batch)

    def _place_loss(self, inputs: dict, num_items_in_batch) -> None:
        """Which loss the graph computes (``loss_choice``), and for ModuleWithLoss's cross-entropy,
        inside the ORT graph (label sparsity can fire) or in PyTorch from ORT's logits.

        ORT 1.19.2's label sparsity fires below ``SPARSITY_THRESHOLD``. Above it there is
        nothing to drop, and ORT's CPU cross-entropy over every position (its gradient kernel is
        serial) is no faster than ``dense_cross_entropy`` in PyTorch."""
        module, mode = self._loss_module, self.args.ort_loss_in_graph
        if not isinstance(module, ModuleWithLoss):
            return  # TRL's fused head: its statistics are computed in the graph, on the used rows only
        labels = inputs.get("labels")
        choice = choose_loss(module, inputs, num_items_in_batch)
        module.use(choice)
        if choice.reason:
            logger.warning("ort_hf: the model's own loss is trained, inside the ORT graph, with no label sparsity: %s.",
                           choice.reason)
            module.loss_in_graph = True
        elif mode != "auto":
            module.loss_in_graph = mode == "always"
        elif module.loss_kind != CROSS_ENTROPY or labels.dim() < 2:
            module.loss_in_graph = True  # sequence-level labels or a user's loss: nothing to gain outside
        else:
            density = module.label_density(labels)
            module.loss_in_graph = self.args.ort_enable_label_sparsity and density < SPARSITY_THRESHOLD
            if not module.loss_in_graph:
                logger.info("ort_hf: loss computed in PyTorch from ORT's logits: label density %.1f%% (first "
                            "batch) leaves label sparsity nothing to drop (--ort_loss_in_graph always to override).",
                            100 * density)
        self._pending_ort_logs["ort/loss_in_graph"] = float(module.loss_in_graph)
        self._pending_ort_logs["ort/model_loss"] = float(module.loss_kind != CROSS_ENTROPY)

    def _report_first_step(self, labels: torch.Tensor | None) -> None:
        self._label_sparsity_checked = True
        engine = self._ort_engine_module
        status = engine.engine_status()
        self._pending_ort_logs.update(
            {
                "ort/export_s": round(status.export_seconds, 3),
                "ort/fallback": float(status.backend == "pytorch"),
            }
        )
        self._pending_ort_logs.update(record_memory_plans(engine, self.args))
        stats = engine.padding_stats
        if stats["total_tokens"]:
            logger.info("ort_hf: trimming trailing padding before ORT: the first batch kept %.1f%% of its token "
                        "positions.", 100 * stats["kept_tokens"] / stats["total_tokens"])
        rewrite = engine.padding_rewrite
        self._pending_ort_logs["ort/padding_eliminated"] = float(rewrite is not None)
        if rewrite is not None:
            logger.info("ort_hf: padding elimination: %d nodes of the graph run on the real tokens only (the "
                        "padded layout rebuilt %d times, for attention and the outputs). --ort_eliminate_padding "
                        "false turns it off.", rewrite.unpadded_nodes, rewrite.pads)
        module = self._loss_module
        if isinstance(module, FusedLMHeadModule) and status.backend == "ort":
            self._pending_ort_logs.update(head_rows_report(engine.training_graph(), module, self._fused_caller))
        if (not isinstance(module, ModuleWithLoss) or labels is None or labels.dim() < 2 or status.backend != "ort"
                or not module.loss_in_graph
                or module.loss_kind != CROSS_ENTROPY):
            return  # sequence-level labels, or the loss runs in PyTorch: nothing for label sparsity to remove
        density = self._loss_module.label_density(labels)  # as the loss sees them (after a causal shift)
        fired = bool(engine.label_sparsity_fired())
        self._pending_ort_logs.update({"ort/label_density": round(density, 4), "ort/label_sparsity": float(fired)})
        if fired:
            logger.warning(
                "ort_hf: label sparsity fired: ORT computes the loss on the %.1f%% of label positions "
                "that are not ignored (first batch).",
                100 * density,
            )
        elif density < SPARSITY_THRESHOLD:
            logger.warning(
                "ort_hf: label sparsity did not fire although label density is %.1f%%: %s",
                100 * density,
                why_no_label_sparsity(self.args, status),
            )
        else:
            logger.info("ort_hf: label sparsity not needed: label density %.1f%% (ORT fires below %d%%).", 100 * density,
                        100 * SPARSITY_THRESHOLD)

    # --- data ------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None):
        if not (self.args.use_ort and self.args.ort_load_balancing_sampler):
            return super()._get_train_sampler(train_dataset)
        from ..engine import LoadBalancingBatchSampler

        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return LoadBalancingBatchSampler(dataset, self.args.per_device_train_batch_size, self.args.world_size,
                                         self.args.process_index, self.args.seed)

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
            if self._ort_facts_due:
                # One-time facts of this run's graph: in the original run's first log only, so a
                # resumed run's log_history is the uninterrupted one's.
                logs.update(self._pending_ort_logs)
            self._pending_ort_logs = {}
            stats = self._ort_engine_module.padding_stats if self._ort_engine_module is not None else {}
            if stats.get("total_tokens"):  # share of token positions ORT computed, so far
                logs["ort/positions_kept"] = round(stats["kept_tokens"] / stats["total_tokens"], 4)
            # Collected here, before the parent logs, so trainer_state.json and every
            # report_to integration get the callbacks' numbers whatever the callback order.
            for observer in self._observers():
                observer.merge_into(self.args, self.state, logs)
        super().log(logs, start_time)


class ORTTrainer(ORTTrainerMixin, Trainer):
    """Drop-in ``Trainer`` whose training steps run in an ORT session."""


@contextlib.contextmanager
def _replaced(obj, **values):
    saved = {name: getattr(obj, name) for name in values}
    try:
        for name, value in values.items():
            setattr(obj, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)
