"""ORTTrainingArguments: TrainingArguments plus typed ORT options, usable from HfArgumentParser."""

from __future__ import annotations

import logging
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Literal

from transformers import TrainingArguments

from .._field_choices import check_choices
from ..engine import ORTOptions
from .deepspeed import check_deepspeed_args

logger = logging.getLogger(__name__)

ADAMW_ORT_FUSED = "adamw_ort_fused"
AUTO_COMPARE_STEPS = 10

# --use_ort: True, False or "auto" once the arguments are built. A Literal because HfArgumentParser
# parses a `bool | str` field as a plain bool, with no room for "auto"; it turns a Literal into
# argparse choices instead. "true" and "false" are the command line's spellings (__post_init__
# makes them True and False).
EngineChoice = Literal["true", "false", "auto", True, False]


def _ort(name: str):
    """The ``--ort_<name>`` field: ``ORTOptions.<name>``'s default and help (a list for a tuple)."""
    option = ORTOptions.__dataclass_fields__[name]
    if option.default_factory is not MISSING:
        return field(default_factory=list, metadata=dict(option.metadata))
    return field(default=option.default, metadata=dict(option.metadata))


@dataclass
class ORTTrainingArguments(TrainingArguments):
    """``TrainingArguments`` for :class:`ORTTrainer`.

    Every ``ORTOptions`` field is available as ``--ort_<field>``; ``use_ort false`` trains the
    same script in plain PyTorch for A/B runs, ``use_ort auto`` on whichever engine this run
    measures faster; ``--optim adamw_ort_fused`` picks ORT's fused
    AdamW on CUDA (torch's fused AdamW, same math, on CPU).
    """

    # Redeclared as a plain string: the parent's OptimizerNames enum has no entry for ORT's
    # optimizer, and HfArgumentParser would reject it as a choice. Validation stays the
    # parent's (plus ours for adamw_ort_fused) in __post_init__. Default unchanged.
    optim: str = field(
        default=TrainingArguments.__dataclass_fields__["optim"].default,
        metadata={
            "help": "The optimizer: any of transformers' OptimizerNames, or 'adamw_ort_fused' "
            "(ORT FusedAdam on CUDA; torch fused AdamW, same math, on CPU)."
        },
    )

    # --- engine selection ---
    use_ort: EngineChoice = field(
        default=True,
        metadata={
            "help": "Train through ONNX Runtime (ORTModule): true; false = plain PyTorch, for A/B runs; auto = "
            "start through ORT, time both engines on this run (--ort_compare_steps) and train the rest of the "
            "run on the faster one.",
            "nargs": "?",  # --use_ort alone means true
            "const": True,
        },
    )
    use_module_with_loss: bool = field(
        default=True,
        metadata={
            "help": "Compute the loss inside the ORT graph through an nn.CrossEntropyLoss module so ORT's "
            "label-sparsity optimisation can fire (ModuleWithLoss)."
        },
    )
    ort_loss_in_graph: str = field(
        default="auto",
        metadata={
            "help": "With ModuleWithLoss, where the cross-entropy runs. 'auto': inside the ORT graph when "
            "token labels are sparse enough for label sparsity (< 90%% used, first batch), else in PyTorch "
            "from ORT's logits (with nothing to drop, ORT's CPU cross-entropy, whose gradient kernel is "
            "serial, is no faster); 'always'; 'never'.",
            "choices": ("auto", "always", "never"),
        },
    )
    # Why on only where the sweep proved it: docs/how-it-works.md, ModuleWithLoss.
    ort_chunked_lm_loss: bool | None = field(
        default=None,
        metadata={
            "help": "With ModuleWithLoss and dense causal-LM labels (--ort_loss_in_graph auto, label sparsity "
            "with nothing to drop), compute the LM head's projection and the cross-entropy fused, in row chunks, "
            "inside the ORT graph (a PythonOp; its products' library: --ort_cpu_lm_head_forward_swap, "
            "--ort_cpu_lm_head_input_grad_swap, --ort_cpu_lm_head_weight_grad_swap): no full logits, none crossing to PyTorch. Used where the first "
            "batch shows the model's logits are its head's projection of its backbone's hidden states (float32, "
            "no PEFT); otherwise the loss runs in PyTorch from ORT's logits. Default: on for the model classes "
            "the architecture sweep proved exact with it (ort_hf/engine/proven_architectures.json, "
            "chunked_lm_loss), off for the others; true: on for any model that passes the first-batch check.",
            "nargs": "?",  # --ort_chunked_lm_loss alone means true
            "const": True,
        },
    )
    ort_load_balancing_sampler: bool = field(
        default=False,
        metadata={
            "help": "Use ORT's LoadBalancingDistributedBatchSampler for the train dataloader: batches of "
            "similar total sequence length per rank (complexity = number of non-padding tokens)."
        },
    )

    # --- observation callbacks (added by ORTTrainer; usable with plain Trainer too) ---
    ort_density_callback: bool = field(
        default=True, metadata={"help": "Log input/label density and non-padding tokens/s (InputDensityCallback)."}
    )
    ort_density_print_every: int | None = field(
        default=None, metadata={"help": "Print the density table every N steps (rank 0)."}
    )
    ort_memory_callback: bool = field(
        default=True, metadata={"help": "Log peak memory per phase (MemoryObserverCallback)."}
    )
    ort_log_facts: bool = field(
        default=True,
        metadata={
            "help": "Add ORT's facts about the run to the training logs: once, what the graph does (ort/export_s, "
            "ort/fallback, ort/loss_in_graph, ...); at each log, ort/positions_kept. With it and both callbacks "
            "off, the logs have exactly Trainer's keys."
        },
    )
    ort_memory_budget_mb: float | None = field(
        default=None,
        metadata={
            "help": "Peak memory budget per step (MB: RSS on CPU, allocated on CUDA). ORTTrainer trains the first "
            "steps on the heaviest recompute (level 2), then re-exports once to the lightest configuration "
            "estimated to fit, going back if its measured peak does not fit (at most two re-exports)."
        },
    )

    ort_compare_steps: int | None = field(
        default=None,
        metadata={
            "help": "After the export step, run N steps through ORT and N in PyTorch (same run, weights and "
            "optimizer), then log both step times, the speed-up, the export cost and after how many "
            f"steps ORT pays for it (ort/break_even_steps). Default: {AUTO_COMPARE_STEPS} with "
            "--use_ort auto, else off (0)."
        },
    )

    # --- ORTOptions, one flag each (ort_<field>): default and help are ORTOptions' ---
    ort_log_level: str = _ort("log_level")
    ort_fallback: str = _ort("fallback")
    ort_opset_version: int = _ort("opset_version")
    ort_save_onnx: bool = _ort("save_onnx")
    ort_onnx_dir: str | None = _ort("onnx_dir")
    ort_profile_dir: str | None = _ort("profile_dir")
    ort_enable_compute_optimizer: bool = _ort("enable_compute_optimizer")
    ort_enable_label_sparsity: bool = _ort("enable_label_sparsity")
    ort_enable_embedding_sparsity: bool = _ort("enable_embedding_sparsity")
    ort_memory_opt_level: int = _ort("memory_opt_level")
    ort_memory_opt_plans: list[str] = _ort("memory_opt_plans")
    ort_export_cache_dir: str | None = _ort("export_cache_dir")
    ort_export_cache_shared: bool = _ort("export_cache_shared")
    ort_deepcopy_before_export: bool = _ort("deepcopy_before_export")
    ort_enable_custom_autograd: bool = _ort("enable_custom_autograd")
    ort_mem_efficient_grad_mgmt: bool = _ort("mem_efficient_grad_mgmt")
    ort_use_triton: bool = _ort("use_triton")
    ort_use_efficient_attention: bool = _ort("use_efficient_attention")
    ort_trim_padding: bool | None = _ort("trim_padding")
    ort_eliminate_padding: bool | None = _ort("eliminate_padding")
    ort_enable_mem_reuse: bool | None = _ort("enable_mem_reuse")
    ort_eval_in_ort: bool = _ort("eval_in_ort")
    ort_intra_op_threads: int | None = _ort("intra_op_threads")
    ort_intra_op_spinning: bool | None = _ort("intra_op_spinning")
    ort_torch_threads_in_graph: int | None = _ort("torch_threads_in_graph")
    ort_cpu_dropout_kernels: bool = _ort("cpu_dropout_kernels")
    ort_cpu_embedding_grad_kernel: bool = _ort("cpu_embedding_grad_kernel")
    ort_cpu_gather_grad_swap: bool = _ort("cpu_gather_grad_swap")
    ort_cpu_tied_embedding_grad: bool = _ort("cpu_tied_embedding_grad")
    ort_cpu_gelu_grad_swap: bool = _ort("cpu_gelu_grad_swap")
    ort_cpu_norm_grad_swap: bool = _ort("cpu_norm_grad_swap")
    ort_cpu_softmax_grad_swap: bool = _ort("cpu_softmax_grad_swap")
    ort_cpu_relu_grad_swap: bool = _ort("cpu_relu_grad_swap")
    ort_cpu_weight_grad_swap: bool | None = _ort("cpu_weight_grad_swap")
    ort_cpu_flash_attention: bool = _ort("cpu_flash_attention")
    ort_cpu_weight_grad_min_dim: int = _ort("cpu_weight_grad_min_dim")
    ort_cpu_linear_product_swap: bool | None = _ort("cpu_linear_product_swap")
    ort_cpu_linear_product_min_dim: int = _ort("cpu_linear_product_min_dim")
    ort_cpu_lm_head_forward_swap: bool | None = _ort("cpu_lm_head_forward_swap")
    ort_cpu_lm_head_input_grad_swap: bool | None = _ort("cpu_lm_head_input_grad_swap")
    ort_cpu_lm_head_weight_grad_swap: bool | None = _ort("cpu_lm_head_weight_grad_swap")
    ort_cpu_cross_entropy_swap: bool = _ort("cpu_cross_entropy_swap")
    ort_preflight: str = _ort("preflight")

    def _refuse_what_ort_cannot_run(self) -> None:
        if not self.use_ort:
            return
        if self.torch_compile:
            raise ValueError(
                "--torch_compile with ORT: both compile the model into their own graph, and ORT exports the "
                "uncompiled model, so torch.compile would never run. Choose one: drop --torch_compile, or "
                "--use_ort false to train with torch.compile in PyTorch."
            )
        if self.bf16 and not self._on_cpu():
            from ..engine import BF16_ON_CUDA

            raise ValueError(BF16_ON_CUDA)
        if (self.fp16 or self.bf16) and self._on_cpu():
            raise ValueError(
                f"--{'fp16' if self.fp16 else 'bf16'} with ORT on CPU: ORTTrainer runs ORT under autocast, which "
                "exports a half-precision graph, and ORT 1.19's CPU kernels have no float16/bfloat16 MatMul. Train "
                "in fp32 through ORT (drop the flag, or pass bf16=False to a config that turns it on when unset), or "
                "in mixed precision in PyTorch with --use_ort false."
            )

    def _settle_unset_precision(self) -> None:
        """For a config whose precision is left unset for its own ``__post_init__`` to choose
        (``ort_hf.trl``'s configs override this): settle it for ORT before that runs. Nothing here."""

    def _on_cpu(self) -> bool:
        import torch

        return self.use_cpu or not torch.cuda.is_available()

    def _ort_on_cpu(self) -> bool:
        return bool(self.use_ort) and self._on_cpu()

    def __post_init__(self):
        from .._versions import warn_untested
        from ..engine import apply_jit_environment

        warn_untested()

        apply_jit_environment()  # before _on_cpu() and TrainingArguments' device set-up initialise CUDA
        # TrainingArguments.__post_init__ turns `optim` into its OptimizerNames enum, which has no
        # entry for ORT's optimizer: validate the rest with a stand-in, then put ours back.
        wants_ort_fused = self.optim == ADAMW_ORT_FUSED
        if wants_ort_fused:
            self.optim = "adamw_torch"
        check_choices(self, ORTTrainingArguments, lambda name: f"--{name}")
        self.use_ort = {"true": True, "false": False}.get(self.use_ort, self.use_ort)
        self._settle_unset_precision()
        if self.ort_compare_steps is None:
            self.ort_compare_steps = AUTO_COMPARE_STEPS if self.use_ort == "auto" else 0
        self._refuse_fsdp()
        if self.use_ort and (self.gradient_checkpointing or self.activation_checkpointing):
            logger.warning(
                "ort_hf: gradient checkpointing is done by ORT's layer-wise recompute "
                "(--ort_memory_opt_level 1) when training through ORT."
            )
            self.gradient_checkpointing = self.activation_checkpointing = False
            self.ort_memory_opt_level = recompute_level_for_checkpointing(
                self.ort_memory_opt_level, self.ort_memory_opt_plans
            )
        self._refuse_what_ort_cannot_run()  # before the parent's own precision checks, so ours is what is said
        super().__post_init__()
        if wants_ort_fused:
            self.optim = ADAMW_ORT_FUSED
            if self.bf16:
                raise ValueError(
                    "--optim adamw_ort_fused does not support bf16 (ORT's FusedAdam has no bf16 kernel): "
                    "use --optim adamw_torch_fused with --bf16, or --fp16 with adamw_ort_fused."
                )
        self._fit_ddp_to_mem_efficient_gradients()
        check_deepspeed_args(self)
        self._check_compare_steps()
        if self.ort_memory_budget_mb is not None and self.ort_memory_budget_mb <= 0:
            raise ValueError(
                f"--ort_memory_budget_mb must be a positive number of MB, got {self.ort_memory_budget_mb}."
            )
        if self.ort_memory_budget_mb is not None and not self.ort_memory_callback:
            raise ValueError("--ort_memory_budget_mb measures with the memory observer: keep --ort_memory_callback on.")
        if self.ort_density_print_every is not None and self.ort_density_print_every < 1:
            raise ValueError(
                f"--ort_density_print_every must be a positive number of steps, got {self.ort_density_print_every}."
            )
        try:
            self._ort_options = self.ort_options()
        except ValueError as exc:
            # Name the command-line flag, not the internal dataclass field.
            raise ValueError(str(exc).replace("ORTOptions.", "--ort_")) from None

    def _check_compare_steps(self) -> None:
        steps = self.ort_compare_steps
        if steps < 0 or (steps == 0 and self.use_ort == "auto"):
            raise ValueError(
                f"--ort_compare_steps must be a number of steps{'' if self.use_ort == 'auto' else ' or 0 (off)'}"
                f", got {steps}."
            )
        if steps and not self.use_ort:
            raise ValueError("--ort_compare_steps times ORT against PyTorch: it needs --use_ort true or auto.")
        if self.use_ort == "auto" and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun / accelerate launch
            raise ValueError(
                "--use_ort auto times each engine in one process, and processes could choose "
                "differently: in distributed training, pass --use_ort true or false (measure with "
                "--ort_compare_steps N on a single process first)."
            )
        if steps and self.ort_memory_budget_mb is not None:
            raise ValueError(
                f"{'--use_ort auto' if self.use_ort == 'auto' else '--ort_compare_steps'} and "
                "--ort_memory_budget_mb both time the first steps: use one."
            )
        if steps and 0 < self.max_steps <= 2 * steps + 1:
            logger.warning(
                "ort_hf: --max_steps %d ends before the engine comparison (1 export step, then %d steps "
                "through each engine): nothing will be compared.",
                self.max_steps,
                steps,
            )

    def _fit_ddp_to_mem_efficient_gradients(self) -> None:
        # With memory-efficient gradients the parameters reach ORT's graph through PythonOps, not
        # as inputs of ORT's autograd function, so DDP's find_unused_parameters search (the
        # Trainer's default) marks every one unused after forward, and ORT's param.backward(grad)
        # then marks it ready a second time: DDP aborts. Every parameter the graph uses does
        # get its gradient, so the search is not needed.
        if not (self.use_ort and self.ort_mem_efficient_grad_mgmt):
            return
        if self.ddp_find_unused_parameters:
            raise ValueError(
                "--ort_mem_efficient_grad_mgmt cannot run with --ddp_find_unused_parameters true (DDP would see each "
                "gradient twice): drop --ddp_find_unused_parameters, or drop --ort_mem_efficient_grad_mgmt."
            )
        self.ddp_find_unused_parameters = False

    def _refuse_fsdp(self) -> None:
        # FSDP wraps the model itself; the Trainer hands it the HF model, not the ORT module, so
        # ORT would silently not run (or crash deep in accelerate). Refuse before any weights load.
        if self.use_ort and self.fsdp:
            raise ValueError(
                "ORTTrainer cannot train through ORT with --fsdp. Use DDP (torchrun / accelerate launch; ORT runs "
                "inside each process) or DeepSpeed ZeRO-1/2 (--deepspeed), or keep --fsdp and pass --use_ort false "
                "to train on the plain PyTorch path."
            )

    def ort_options(self) -> ORTOptions:
        """The ``ORTOptions`` these arguments describe."""
        values = {f.name: getattr(self, f"ort_{f.name}") for f in fields(ORTOptions)}
        values["memory_opt_plans"] = tuple(values["memory_opt_plans"] or ())
        if values["eliminate_padding"] is None and self.train_sampling_strategy == "group_by_length":
            # Length-grouped batches are nearly all real tokens, and the sampler puts its longest,
            # mixed-length batch first: the batch that builds the graph speaks for none of the others.
            values["eliminate_padding"] = False
        return ORTOptions(**values)


def recompute_level_for_checkpointing(level: int, plans) -> int:
    """ORT's memory optimizer level that stands for gradient checkpointing: ORT cannot export
    torch.utils.checkpoint functions, and its layer-wise recompute (level 1) is the equivalent,
    unless a level or plans were chosen already. The two never run together."""
    return 1 if level == 0 and not plans else level
