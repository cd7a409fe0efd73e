"""``ORTSFTConfig``, ``ORTDPOConfig``, ``ORTKTOConfig``, ``ORTRewardConfig``, ``ORTGRPOConfig`` and
``ORTRLOOConfig``: TRL's configs with the ORT options (``--ort_*``, ``--use_ort``)."""

from __future__ import annotations

from dataclasses import dataclass

from trl import DPOConfig, GRPOConfig, KTOConfig, RewardConfig, RLOOConfig, SFTConfig

from .arguments import ORTTRLArguments
from .online import refuse_online_options

# The base of the ORT config derived for a TRL config not declared here (trainer/parent_binding.py).
ORT_ARGUMENTS_BASE = ORTTRLArguments


def _refuse_without_loss_module(args) -> None:
    if args.use_ort and not args.use_module_with_loss:
        raise ValueError(
            "use_module_with_loss=False with a TRL trainer: through ORT, TRL's fused LM head is always "
            "computed by a module around the model (ort_hf/module_with_loss/fused_lm_head.py). Drop the flag."
        )


@dataclass
class ORTSFTConfig(ORTTRLArguments, SFTConfig):
    """``SFTConfig`` for :class:`ORTSFTTrainer`, plus every ``ORTTrainingArguments`` option.

    Defaults are TRL's, except where ORT trains on CPU: ``bf16`` left unset means fp32 there (ORT's
    CPU kernels have no bfloat16), and ``gradient_checkpointing`` (TRL's default: on) becomes ORT's
    layer-wise recompute, as with every ORT trainer."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)


@dataclass
class ORTDPOConfig(ORTTRLArguments, DPOConfig):
    """``DPOConfig`` for :class:`ORTDPOTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s)."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)


@dataclass
class ORTKTOConfig(ORTTRLArguments, KTOConfig):
    """``KTOConfig`` for :class:`ORTKTOTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s)."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)


@dataclass
class ORTRewardConfig(ORTTRLArguments, RewardConfig):
    """``RewardConfig`` for :class:`ORTRewardTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s)."""


@dataclass
class ORTGRPOConfig(ORTTRLArguments, GRPOConfig):
    """``GRPOConfig`` for :class:`ORTGRPOTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s). ``use_vllm`` and ``use_liger_kernel`` are refused (``online.py``)."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)
        refuse_online_options(self, "ORTGRPOTrainer")


@dataclass
class ORTRLOOConfig(ORTTRLArguments, RLOOConfig):
    """``RLOOConfig`` for :class:`ORTRLOOTrainer`, plus every ``ORTTrainingArguments`` option (defaults as
    :class:`ORTSFTConfig`'s). ``use_vllm`` and ``use_liger_kernel`` are refused (``online.py``)."""

    def __post_init__(self):
        super().__post_init__()
        _refuse_without_loss_module(self)
        refuse_online_options(self, "ORTRLOOTrainer")
