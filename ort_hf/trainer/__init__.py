from .ort_trainer import ORTTrainer, ORTTrainerMixin
from .seq2seq import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments
from .training_args import ADAMW_ORT_FUSED, ORTTrainingArguments

__all__ = [
    "ADAMW_ORT_FUSED",
    "ORTSeq2SeqTrainer",
    "ORTSeq2SeqTrainingArguments",
    "ORTTrainer",
    "ORTTrainerMixin",
    "ORTTrainingArguments",
]
