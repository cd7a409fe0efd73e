"""ORTSeq2SeqTrainer: ``Seq2SeqTrainer`` with ORTTrainer's hooks (summarisation, translation).

Training steps run through ORT; ``predict_with_generate`` generates with the plain model in
PyTorch, as every evaluation does (``generate`` is a Python loop ORT cannot export).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from .ort_trainer import ORTTrainerMixin
from .training_args import ORTTrainingArguments


@dataclass
class ORTSeq2SeqTrainingArguments(ORTTrainingArguments, Seq2SeqTrainingArguments):
    """``Seq2SeqTrainingArguments`` (``predict_with_generate``, ``generation_*``) with the ORT options."""


class ORTSeq2SeqTrainer(ORTTrainerMixin, Seq2SeqTrainer):
    """Drop-in ``Seq2SeqTrainer`` whose training steps run in an ORT session."""

    ort_args_class = ORTSeq2SeqTrainingArguments
