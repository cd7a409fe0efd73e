from .ort_trainer import ORTTrainer
from .training_args import ADAMW_ORT_FUSED, ORTTrainingArguments

__all__ = ["ADAMW_ORT_FUSED", "ORTTrainer", "ORTTrainingArguments"]
