"""ORTTrainer: transformers.Trainer that trains through ONNX Runtime's ORTModule.

It overrides narrow hooks only (``_wrap_model``, ``compute_loss``, ``get_optimizer_cls_and_kwargs``,
``log``, ``_get_train_sampler``, ``_save``) and checks around ``train``; the training loop,
checkpointing, resume, evaluation and callbacks are the parent's. ``self.model`` stays the plain
Hugging Face model, so saved checkpoints are ordinary HF checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.training_args import ParallelMode

from ..callbacks import BatchObserver, InputDensityCallback, MemoryObserverCallback
from ..engine import ORTOptions, wrap_model
from ..engine.export import INFERENCE_OPSET
from ..engine.optim import fused_adamw_cls_and_kwargs
from ..module_with_loss import ModuleWithLoss, missing_labels_error
from .checks import (check_output_dir_writable, check_token_ids, check_train_dataset, checkpoint_problem,
                     last_complete_checkpoint, unfinished_checkpoint_guard)
from .deepspeed import prepare_deepspeed
from .training_args import ADAMW_ORT_FUSED, ORTTrainingArguments

logger = logging.getLogger(__name__)

# ORT 1.19.2 fires label sparsity when fewer than this share of labels are used.
LABEL_SPARSITY_THRESHOLD = 0.9
MEMORY_PLANS_FILE = "ort_memory_plans.json"


def _as_ort_args(args: TrainingArguments | None) -> ORTTrainingArguments:
    if args is None:
        return ORTTrainingArguments(output_dir="trainer_output")
    if isinstance(args, ORTTrainingArguments):
        return args
    # A plain TrainingArguments keeps every value it was given, with ORT defaults added.
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    return ORTTrainingArguments(**values)


class ORTTrainer(Trainer):
    """Drop-in ``Trainer`` whose training steps run in an ORT session.

    Evaluation and prediction run the plain model in PyTorch unless ``ort_eval_in_ort``.
    """

    def __init__(self, model=None, args=None, *pargs, **kwargs):
        super().__init__(model, _as_ort_args(args), *pargs, **kwargs)
        self._ort_engine_module = None  # the ORTTrainingModule of the current train() attempt
        self._ort_train_model = None  # what _wrap_model returned (DDP outside it when distributed)
        self._ort_eval_module = None
        self._pending_ort_logs: dict[str, float] = {}
        self._loss_module: ModuleWithLoss | None = None  # inside the engine module when use_module_with_loss
        self._label_sparsity_checked = False
        self._seeded_step, self._micro_step = -1, 0
        if self.args.use_ort and self.args.use_module_with_loss:
            # ModuleWithLoss takes num_items_in_batch whatever the model's forward accepts.
            self.model_accepts_loss_kwargs = True
        self._add_default_callbacks()

    def _add_default_callbacks(self) -> None:
        present = {type(cb) for cb in self.callback_handler.callbacks}
        if self.args.ort_density_callback and InputDensityCallback not in present:
            self.add_callback(InputDensityCallback(print_every=self.args.ort_density_print_every))
        if self.args.ort_memory_callback and MemoryObserverCallback not in present:
            self.add_callback(MemoryObserverCallback())
        if self.args.use_ort and self.args.ort_memory_budget_mb:
            from .budget import MemoryBudgetController

            observer = next(cb for cb in self.callback_handler.callbacks if isinstance(cb, MemoryObserverCallback))
            self.add_callback(MemoryBudgetController(self, self.args.ort_memory_budget_mb, observer))

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
        with unfinished_checkpoint_guard(self.args.output_dir, lambda: self.state.global_step):
            return super().train(resume_from_checkpoint, *args, **kwargs)

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
        if self._ort_engine_module is not None:
            self._ort_engine_module.release()  # a retry (auto_find_batch_size): free the old session first
        engine_module = wrap_model(self._training_target(), self._training_options())
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

    def _training_target(self) -> nn.Module:
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
        )
        return self._loss_module

    def _training_options(self) -> ORTOptions:
        options = self.args.ort_options()
        if self.args.ort_memory_budget_mb:
            from .budget import START_LEVEL

            # Budget mode starts on the heaviest rung and lightens from there (budget.py).
            options = dataclasses.replace(options, memory_opt_level=START_LEVEL, memory_opt_plans=())
        if getattr(self.model, "is_activation_checkpointing", False):
            # Checkpoint functions cannot be exported; ORT's layer-wise recompute does the job.
            logger.warning("ort_hf: gradient checkpointing on the model is replaced by ORT layer-wise recompute.")
            self.model.activation_checkpointing_disable()
            if options.memory_opt_level == 0 and not options.memory_opt_plans:
                options = dataclasses.replace(options, memory_opt_level=1)
        return options

    def _ort_eval_model(self) -> nn.Module:
        if self._ort_eval_module is None or self._ort_eval_module.module is not self.model:
            options = dataclasses.replace(self.args.ort_options(), eval_in_ort=True)
            self._ort_eval_module = wrap_model(self.model, options)
        return self._ort_eval_module

    def ort_engine_status(self):
        """What ran the last training attempt (``EngineStatus``), or None when ORT was not used."""
        return None if self._ort_engine_module is None else self._ort_engine_module.engine_status()

    def export_onnx(self, output_dir: str, sample_inputs: dict | None = None,
                    opset_version: int = INFERENCE_OPSET) -> str:
        """Write an inference ONNX model of the trained model (logits) plus its config and
        tokenizer files to ``output_dir``; it is checked in onnxruntime against PyTorch's
        logits (atol 1e-4) before this returns. ``sample_inputs`` defaults to one batch of the
        eval (or train) dataset. ``opset_version`` is the inference model's ONNX opset; it is not
        ``--ort_opset_version``, which is the training export's (16, for ORT's optimiser)."""
        from ..engine.export import export_inference_onnx

        if sample_inputs is None:
            dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
            if isinstance(dataset, dict):
                dataset = next(iter(dataset.values()))
            loader = self.get_eval_dataloader(dataset) if dataset is not None else None
            if loader is None:
                raise ValueError("export_onnx needs sample_inputs or a train/eval dataset to take one batch from.")
            sample_inputs = next(iter(loader))
        batches = [dict(sample_inputs)]
        half = {k: v[: max(1, len(v) // 2)] for k, v in sample_inputs.items() if torch.is_tensor(v)}
        path = export_inference_onnx(self.model, batches[0], output_dir, opset_version,
                                     check_inputs=[half])  # a second batch size checks the dynamic axes
        self.model.config.save_pretrained(output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        return str(path)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # Under DeepSpeed the parent reads the weights through DeepSpeed's engine, whose module is
        # the ORT wrapper (keys would carry its prefixes). ZeRO-1/2 keep every weight whole in
        # self.model: its own state dict is the plain HF checkpoint.
        if self.is_deepspeed_enabled and self.args.use_ort:
            state_dict = None
        super()._save(output_dir, state_dict)

    # --- loss ------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        through_engine = (
            model is self._ort_train_model and model is not None and self._loss_module is not None
        ) and not return_outputs
        if not through_engine:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs.get("labels")
        if labels is None:
            raise missing_labels_error(inputs)  # before ORT traces a graph without a loss
        check_token_ids(inputs, getattr(getattr(self.model, "config", None), "vocab_size", None))
        if not self._label_sparsity_checked:
            self._place_loss(labels)  # before the first forward: it decides what ORT exports
        self._reseed_ort()
        if self._loss_module.loss_in_graph:
            # ModuleWithLoss already applied label smoothing / compute_loss_func inside the graph;
            # the parent must only read outputs["loss"] and scale it across devices as usual.
            hooks = {"label_smoother": None, "compute_loss_func": None}
        else:
            # ORT returns logits; the parent hands them to the same loss, in PyTorch.
            hooks = {"label_smoother": None, "compute_loss_func": self._loss_module.loss_from_outputs,
                     "model_accepts_loss_kwargs": False}
        try:
            with _replaced(self, **hooks):
                loss = super().compute_loss(model, inputs, False, num_items_in_batch)
        except RuntimeError as exc:
            last = last_complete_checkpoint(self.args.output_dir)
            raise RuntimeError(
                f"ORT failed at step {self.state.global_step + 1}: {exc}\n"
                f"Last complete checkpoint: {last or 'none yet'} (resume with resume_from_checkpoint=True)."
            ) from exc
        if not torch.isfinite(loss.detach()).all():
            logger.warning("ort_hf: non-finite loss %s at step %d (the logged loss filters it when "
                           "logging_nan_inf_filter is on, as the Trainer does).", loss.item(), self.state.global_step + 1)
        if not self._label_sparsity_checked:
            self._report_first_step(labels)
        return loss

    def _place_loss(self, labels: torch.Tensor) -> None:
        """Loss inside the ORT graph (label sparsity can fire) or in PyTorch from ORT's logits.

        ORT 1.19.2's label sparsity fires below 90% label density. Above it there is nothing to
        drop, and ORT's CPU cross-entropy kernel over every position is slower than PyTorch's
        (measured on the causal-LM bench: 1,862 ms/step inside vs 1,563 ms outside).
        """
        module, mode = self._loss_module, self.args.ort_loss_in_graph
        if mode != "auto":
            module.loss_in_graph = mode == "always"
        elif labels.dim() < 2 or not module.takes_token_class_labels(labels):
            module.loss_in_graph = True  # sequence-level labels or a user's loss: nothing to gain outside
        else:
            density = module.label_density(labels)
            module.loss_in_graph = self.args.ort_enable_label_sparsity and density < LABEL_SPARSITY_THRESHOLD
            if not module.loss_in_graph:
                logger.info("ort_hf: loss computed in PyTorch from ORT's logits: label density %.1f%% (first "
                            "batch) leaves label sparsity nothing to drop (--ort_loss_in_graph always to override).",
                            100 * density)
        self._pending_ort_logs["ort/loss_in_graph"] = float(module.loss_in_graph)

    def _reseed_ort(self) -> None:
        # One seed per micro-step from (seed, global step, micro-step): dropout masks in the ORT
        # graph then survive a resume, which restores torch's RNG but cannot restore ORT's.
        step = self.state.global_step
        self._micro_step = self._micro_step + 1 if step == self._seeded_step else 0
        self._seeded_step = step
        self._ort_engine_module.reseed(self.args.seed * 1_000_003 + step * 1_009 + self._micro_step)

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
        self._record_memory_plans(engine)
        stats = engine.padding_stats
        if stats["total_tokens"]:
            logger.info("ort_hf: trimming trailing padding before ORT (no padding elimination on CPU): "
                        "the first batch kept %.1f%% of its token positions.",
                        100 * stats["kept_tokens"] / stats["total_tokens"])
        if labels is None or labels.dim() < 2 or status.backend != "ort" or not self._loss_module.loss_in_graph:
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
        elif density < LABEL_SPARSITY_THRESHOLD:
            logger.warning(
                "ort_hf: label sparsity did not fire although label density is %.1f%%: %s",
                100 * density,
                self._why_no_label_sparsity(status),
            )
        else:
            logger.info("ort_hf: label sparsity not needed: label density %.1f%% (ORT fires below 90%%).", 100 * density)

    def _record_memory_plans(self, engine) -> None:
        """The recompute plans ORT found: logged once, saved as JSON, counted in the metrics."""
        plans = engine.memory_plans()
        if not plans:
            return
        on = [p for p in plans if p.enabled]
        self._pending_ort_logs["memory/plans_on"] = float(len(on))
        self._pending_ort_logs["memory/plan_bytes_saved"] = float(sum(p.bytes_saved or 0 for p in on))
        if self.args.should_save:
            os.makedirs(self.args.output_dir, exist_ok=True)
            with open(os.path.join(self.args.output_dir, MEMORY_PLANS_FILE), "w") as f:
                json.dump([dataclasses.asdict(p) for p in plans], f, indent=2)
        rows = "\n".join(f"  {'ON ' if p.enabled else 'OFF'} {p.plan:<45} x{p.frequency:<3} {p.bytes_saved or 0:>14,.0f}"
                         for p in plans)
        logger.info("ort_hf: ORT memory optimizer plans (first batch; bytes saved per step):\n%s", rows)

    def _why_no_label_sparsity(self, status) -> str:
        if not self.args.ort_enable_label_sparsity:
            return "--ort_enable_label_sparsity is off."
        if not status.pythonop:
            return "ORT's PythonOp extension is unavailable (see `ort-hf doctor`)."
        return "ORT did not rewrite the loss; run with --ort_save_onnx and inspect the graph."

    # --- data ------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None):
        if not (self.args.use_ort and self.args.ort_load_balancing_sampler):
            return super()._get_train_sampler(train_dataset)
        from ..engine.sampler import LoadBalancingBatchSampler

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
