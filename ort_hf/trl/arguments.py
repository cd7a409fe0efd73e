"""``ORTTRLArguments``: the ORT options as TRL's configs take them (the base of ``ORTSFTConfig``,
``ORTDPOConfig`` and of the ORT config derived for any other TRL config)."""

from __future__ import annotations

from dataclasses import dataclass

from ..trainer.training_args import ORTTrainingArguments


@dataclass
class ORTTRLArguments(ORTTrainingArguments):
    """``ORTTrainingArguments`` with TRL's unset ``bf16`` settled for ORT.

    TRL's configs declare ``bf16=None`` for "bf16 unless fp16", turned into ``True`` by their
    ``__post_init__``. ORT's CPU kernels have no bfloat16, so left unset it means fp32 on CPU (an
    explicit ``bf16=True`` is refused), with ``use_ort=False`` too, so that an A/B run compares like
    with like. On CUDA, bf16 is what TRL would choose and ORT cannot train it: refused, saying what
    to pass."""

    def _settle_unset_precision(self) -> None:
        if getattr(self, "bf16", False) is not None:
            return
        if self._on_cpu():
            self.bf16 = False
        elif self.use_ort and not self.fp16:
            from ..engine import BF16_ON_CUDA

            raise ValueError(
                f"{BF16_ON_CUDA} TRL's configs turn bf16 on when it is left unset: pass fp16=True "
                "(or bf16=False for fp32)."
            )
