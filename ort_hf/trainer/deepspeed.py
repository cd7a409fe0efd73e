"""DeepSpeed ZeRO-1/2 around the ORT module, the way DDP is: DeepSpeed outside, ORTModule inside.

The Trainer hands DeepSpeed ``self.model`` only when ``_wrap_model`` returned it unchanged; ours
returns the ORT engine module, so ORTTrainer prepares that module with the optimizer itself
(``prepare_deepspeed``). ZeRO-3 partitions the parameters, which ORT cannot export: refused.
With ``--fp16`` the prepared ZeRO optimizer goes through ORT's ``FP16_Optimizer`` (its recipe
for DeepSpeed); whether ORT actually swapped in its fused kernels is reported, not assumed.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def check_deepspeed_args(args) -> None:
    """Refuse, before any weights load, what DeepSpeed cannot do around ORT."""
    if not (args.use_ort and args.deepspeed):
        return
    config = args.hf_deepspeed_config
    if config.is_zero3():
        raise ValueError(
            "ZeRO stage 3 partitions the parameters, which ORT cannot export: set zero_optimization.stage to 1 or 2 "
            "in the DeepSpeed config, or pass --use_ort false to train with ZeRO-3 in plain PyTorch."
        )
    for flag, value in (
        ("--ort_mem_efficient_grad_mgmt", args.ort_mem_efficient_grad_mgmt),
        ("--ort_memory_budget_mb", args.ort_memory_budget_mb),
    ):
        if value:
            raise ValueError(f"{flag} is not supported with --deepspeed: drop one of the two.")


def prepare_deepspeed(trainer, engine_module):
    """DeepSpeed's engine around ``engine_module``, with the trainer's optimizer (and DeepSpeed's
    scheduler when the config has one) prepared with it; returns the DeepSpeed engine."""
    objects = [engine_module, trainer.optimizer]
    if type(trainer.lr_scheduler).__name__ == "DummyScheduler":  # the config's scheduler
        objects.append(trainer.lr_scheduler)
    prepared = trainer.accelerator.prepare(*objects)
    trainer.optimizer = prepared[1]
    if len(prepared) > 2:
        trainer.lr_scheduler = prepared[2]
    if trainer.args.fp16:
        _apply_fp16_optimizer(trainer)
    _pass_through_next_prepare(trainer.accelerator, trainer.optimizer)
    return prepared[0]


def _apply_fp16_optimizer(trainer) -> None:
    from ..engine import apply_fp16_optimizer

    reason = apply_fp16_optimizer(trainer.optimizer)
    trainer.add_ort_logs({"ort/fp16_optimizer": float(reason is None)})
    if reason is None:
        logger.info("ort_hf: ORT's FP16_Optimizer runs DeepSpeed's overflow check and gradient norm in fused kernels.")
    else:
        logger.warning(
            "ort_hf: ORT's FP16_Optimizer left DeepSpeed's optimizer unchanged (DeepSpeed's own "
            "fp16 code runs, results are the same): %s",
            reason,
        )


def _pass_through_next_prepare(accelerator, optimizer) -> None:
    # Having got a wrapper back from _wrap_model, the Trainer's loop prepares the optimizer once
    # more; accelerate would take the DeepSpeed-wrapped optimizer for a second optimizer and
    # refuse it when the config has its own. That one call returns it unchanged; any other call
    # goes to accelerate as usual, and the instance is back to the class method after one call.
    def prepare(*args, **kwargs):
        del accelerator.prepare
        if len(args) == 1 and args[0] is optimizer and not kwargs:
            return optimizer
        return accelerator.prepare(*args, **kwargs)

    accelerator.prepare = prepare
