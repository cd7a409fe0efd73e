"""ModuleWithLoss: the model and its loss as one module, so ORT exports the loss into its graph.

ORT 1.19.2 detects label sparsity with a forward pre-hook on registered ``nn.CrossEntropyLoss``
submodules. transformers 5 computes losses functionally (``loss_function`` ->
``nn.functional.cross_entropy``), which that hook never sees, so ORT would run the LM head
over every position. Here the loss goes through a registered ``nn.CrossEntropyLoss`` on 2-D
logits and 1-D labels, with the Trainer's own semantics: ``num_items_in_batch`` for correct
gradient accumulation, label smoothing (as ``LabelSmoother``), the causal-LM label shift,
and a user ``compute_loss_func``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

IGNORE_INDEX = -100


class ModuleWithLoss(nn.Module):
    """Wraps ``model``; ``forward(**batch)`` returns ``{"loss": loss}`` for a batch with ``labels``.

    Args:
        model: the Hugging Face model.
        label_smoothing: as ``TrainingArguments.label_smoothing_factor``.
        shift_labels: the causal-LM shift (position i predicts label i+1). The Trainer passes
            its own decision; ``None`` detects it from the model's loss type.
        compute_loss_func: the Trainer's ``compute_loss_func(outputs, labels, num_items_in_batch)``;
            traced into the graph with the model, so it must be plain tensor code.

    ``loss_in_graph = False`` makes ``forward`` return ``{"logits": ...}`` only; the caller then
    computes the same loss in PyTorch with :meth:`loss_from_outputs`. Worth it when labels are
    dense (causal LM): there is nothing for label sparsity to drop, and ORT's CPU cross-entropy
    kernel is slower than PyTorch's.
    """

    def __init__(
        self,
        model: nn.Module,
        label_smoothing: float = 0.0,
        shift_labels: bool | None = None,
        compute_loss_func: Callable | None = None,
    ):
        super().__init__()
        self.model = model
        self.shift_labels = _is_causal_lm(model) if shift_labels is None else shift_labels
        self.compute_loss_func = compute_loss_func
        self.label_smoothing = label_smoothing
        # reduction="sum": the mean is taken over num_items_in_batch (the whole accumulated
        # batch) when the Trainer gives it, as transformers' fixed_cross_entropy does. No
        # label_smoothing argument: its ONNX export is unsupported, so smoothing is added below.
        self.loss_fct = nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
        self.loss_in_graph = True

    def forward(self, labels: torch.Tensor | None = None, num_items_in_batch: torch.Tensor | None = None, **inputs):
        if not self.loss_in_graph:
            outputs = self.model(**inputs)
            return {"logits": _output(outputs, "logits")}
        if labels is None:
            raise missing_labels_error(inputs)
        if self.compute_loss_func is not None:
            outputs = self.model(**inputs)
            return {"loss": self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)}
        if not self._is_class_label(labels):
            # Regression and multi-label targets: the model's own loss (MSE / BCE).
            outputs = self.model(labels=labels, **inputs)
            return {"loss": _output(outputs, "loss")}
        return {"loss": self.loss_from_outputs(self.model(**inputs), labels, num_items_in_batch)}

    def token_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels as the loss sees them: flattened, shifted for a causal LM."""
        if self.shift_labels:
            # As transformers' ForCausalLMLoss: pad then shift the labels, leave logits whole.
            labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        return labels.reshape(-1)

    def label_density(self, labels: torch.Tensor) -> float:
        """Share of the label positions the loss uses (after the causal shift)."""
        return float((self.token_labels(labels) != IGNORE_INDEX).float().mean())

    def takes_token_class_labels(self, labels: torch.Tensor) -> bool:
        """True when the loss is the cross-entropy over class labels (not a user's or the model's own)."""
        return self.compute_loss_func is None and self._is_class_label(labels)

    def loss_from_outputs(self, outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """The cross-entropy of ``forward``, from the model's outputs (usable as a Trainer
        ``compute_loss_func``)."""
        logits = _output(outputs, "logits")
        logits = logits.float().reshape(-1, logits.shape[-1])
        labels = self.token_labels(labels).to(logits.device)
        loss = self.loss_fct(logits, labels)
        if num_items_in_batch is None:
            num_items_in_batch = (labels != IGNORE_INDEX).sum()
        elif torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        if self.label_smoothing:
            # As transformers' LabelSmoother: (1-eps) * nll + eps * mean over classes of -log p,
            # both over the non-ignored positions.
            neg_log_probs = -nn.functional.log_softmax(logits, dim=-1).sum(dim=-1)
            smooth = neg_log_probs.masked_fill(labels == IGNORE_INDEX, 0.0).sum() / logits.shape[-1]
            loss = (1 - self.label_smoothing) * loss + self.label_smoothing * smooth
        return loss / num_items_in_batch

    def _is_class_label(self, labels: torch.Tensor) -> bool:
        if labels.is_floating_point():
            return False
        config = getattr(self.model, "config", None)
        problem = getattr(config, "problem_type", None)
        if problem in ("regression", "multi_label_classification"):
            return False
        if problem is None and type(self.model).__name__.endswith("ForSequenceClassification"):
            if getattr(config, "num_labels", 2) == 1:
                return False
            config.problem_type = "single_label_classification"  # as the model's own loss would set it
        return True


def _output(outputs, key: str) -> torch.Tensor:
    """``outputs[key]`` of a ModelOutput / dict, or the first element of a tuple output."""
    return outputs[key] if isinstance(outputs, dict) else outputs[0]


def missing_labels_error(batch) -> ValueError:
    return ValueError(
        "ModuleWithLoss needs `labels` in every training batch, and this batch has none "
        f"(keys: {', '.join(sorted(batch))}). Add labels to the dataset / collator, set "
        "label_names if they are called differently, or set use_module_with_loss=False."
    )


def _is_causal_lm(model: nn.Module) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
