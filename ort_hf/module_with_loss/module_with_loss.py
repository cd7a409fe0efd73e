"""ModuleWithLoss: the model and its loss as one module, so ORT exports the loss into its graph.

ORT 1.19.2 detects label sparsity with a forward pre-hook on registered ``nn.CrossEntropyLoss``
submodules. transformers 5 computes losses functionally (``loss_function`` ->
``nn.functional.cross_entropy``), which that hook never sees, so ORT would run the LM head
over every position. Here the loss can go through a registered ``nn.CrossEntropyLoss`` on 2-D
logits and 1-D labels, with the Trainer's own semantics: ``num_items_in_batch`` for correct
gradient accumulation, label smoothing (as ``LabelSmoother``), the causal-LM label shift,
and a user ``compute_loss_func``.

That cross-entropy replaces the model's loss only where it is the model's loss (``loss_choice``
decides, and checks it on the first batch); otherwise the model's own loss runs in the graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .chunked_lm_loss import chunked_linear_cross_entropy
from .dense_cross_entropy import summed_cross_entropy

IGNORE_INDEX = -100

# What ``forward`` computes as the loss.
CROSS_ENTROPY = "cross_entropy"  # the registered nn.CrossEntropyLoss (label sparsity can fire)
MODEL_LOSS = "model"  # the model's own loss, from every input it takes (labels or others)
USER_LOSS = "compute_loss_func"  # the Trainer's compute_loss_func
LOSS_KINDS = (CROSS_ENTROPY, MODEL_LOSS, USER_LOSS)


class ModuleWithLoss(nn.Module):
    """Wraps ``model``; ``forward(**batch)`` returns ``{"loss": loss}``.

    Args:
        model: the Hugging Face model.
        label_smoothing: as ``TrainingArguments.label_smoothing_factor``.
        shift_labels: the causal-LM shift (position i predicts label i+1). The Trainer passes
            its own decision; ``None`` detects it from the model's loss type.
        compute_loss_func: the Trainer's ``compute_loss_func(outputs, labels, num_items_in_batch)``;
            traced into the graph with the model, so it must be plain tensor code.
        model_accepts_loss_kwargs: the Trainer's flag for ``model``: whether it hands
            ``num_items_in_batch`` to the model, so whether the model's loss is normalised by it.

    ``loss_kind`` is one of ``LOSS_KINDS`` (set before the first forward: what the Trainer
    would compute). ``loss_in_graph = False`` (cross-entropy only) makes ``forward`` return
    ``{"logits": ...}``; the caller then computes the same loss in PyTorch with
    :meth:`loss_from_outputs`. Worth it when labels are dense (causal LM): there is nothing for
    label sparsity to drop, and ORT's CPU cross-entropy kernel is slower than PyTorch's.
    ``chunked_head = True`` (a causal LM's cross-entropy, :mod:`.chunked_head` decides) computes the
    same loss from the backbone's hidden states with :mod:`.chunked_lm_loss`: the head's projection
    and the cross-entropy fused, in row chunks, inside the graph.
    """

    def __init__(
        self,
        model: nn.Module,
        label_smoothing: float = 0.0,
        shift_labels: bool | None = None,
        compute_loss_func: Callable | None = None,
        model_accepts_loss_kwargs: bool = True,
    ):
        super().__init__()
        self.model = model
        self.shift_labels = _is_causal_lm(model) if shift_labels is None else shift_labels
        self.compute_loss_func = compute_loss_func
        self.label_smoothing = label_smoothing
        self.model_accepts_loss_kwargs = model_accepts_loss_kwargs
        # reduction="sum": the mean is taken over num_items_in_batch (the whole accumulated
        # batch) when the Trainer gives it, as transformers' fixed_cross_entropy does. No
        # label_smoothing argument: its ONNX export is unsupported, so smoothing is added below.
        self.loss_fct = nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
        self.loss_kind = USER_LOSS if compute_loss_func is not None else CROSS_ENTROPY
        # Whether the cross-entropy divides by num_items_in_batch (as transformers' loss_function)
        # or takes the batch mean (as a model's inline nn.CrossEntropyLoss()): the model's choice.
        self.per_num_items = True
        self.loss_in_graph = True
        self.chunked_head = False
        self.head_threads = 1  # PyTorch's threads for the fused head (its count outside ORT's graph)
        self.head_product = None  # the name of the fused head's forward product, if not mm (chunked_lm_loss.PRODUCTS)
        # The first batch's label density, and whether it is low enough for ORT's export hook to
        # flag the labels (ORTTrainer sets both with the loss placement, before ORT exports).
        self.first_label_density = 1.0
        self.sparse_first_labels = False

    def extra_repr(self) -> str:
        # Everything besides the code and the weights that decides the graph ORT exports: ORT's
        # export cache keys its entries by the module's repr (export_cache.py).
        return (
            f"loss_kind={self.loss_kind}, per_num_items={self.per_num_items}, takes_num_items={self.takes_num_items}, "
            f"loss_in_graph={self.loss_in_graph}, chunked_head={self.chunked_head}, head_threads={self.head_threads}, "
            f"head_product={self.head_product}, "
            f"shift_labels={self.shift_labels}, label_smoothing={self.label_smoothing}, "
            f"label_flags_expected={self.label_flags_expected}, compute_loss_func={_identity(self.compute_loss_func)}"
        )

    @property
    def label_flags_expected(self) -> int:
        """How many label-sparsity flags ORT's export hook puts in this module's graph (one on its
        registered cross-entropy, when that runs in the graph on sparse labels), where label
        sparsity is on; ``export_cache`` keeps a graph only when its flags are the declared ones."""
        return int(
            self.loss_kind == CROSS_ENTROPY
            and self.loss_in_graph
            and not self.chunked_head
            and self.sparse_first_labels
        )

    def flagged_labels(self) -> dict[str, float]:
        """The submodule ORT's export hook flags (its registered cross-entropy, by name), with the
        first batch's label density in percent, as the hook notes it for ORT's banner."""
        return {"loss_fct": 100 * self.first_label_density} if self.label_flags_expected else {}

    def use(self, choice) -> None:
        """Take a ``loss_choice.LossChoice`` (made on the first batch, before ORT exports)."""
        self.loss_kind, self.per_num_items = choice.kind, choice.per_num_items

    @property
    def takes_num_items(self) -> bool:
        """Whether the loss is normalised by ``num_items_in_batch`` when the Trainer has one,
        exactly where the Trainer's own loss would be."""
        if self.loss_kind == USER_LOSS or (self.loss_kind == CROSS_ENTROPY and self.label_smoothing):
            return True  # compute_loss_func and LabelSmoother always receive it
        if self.loss_kind == CROSS_ENTROPY and not self.per_num_items:
            return False
        return self.model_accepts_loss_kwargs

    def forward(self, labels: torch.Tensor | None = None, num_items_in_batch: torch.Tensor | None = None, **inputs):
        if not self.takes_num_items:
            num_items_in_batch = None
        if self.loss_kind == MODEL_LOSS:
            if labels is not None:
                inputs["labels"] = labels
            if num_items_in_batch is not None:
                inputs["num_items_in_batch"] = num_items_in_batch
            return {"loss": model_loss(self.model(**inputs), inputs)}
        if not self.loss_in_graph:
            if labels is not None:
                inputs = self.with_decoder_inputs(inputs, labels)
            return {"logits": _output(self.model(**inputs), "logits")}
        if self.loss_kind == USER_LOSS:
            outputs = self.model(**inputs)
            return {"loss": self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)}
        if labels is None:
            raise missing_labels_error(inputs)
        if self.chunked_head:
            return {"loss": self.chunked_head_loss(inputs, labels, num_items_in_batch)}
        return {
            "loss": self.loss_from_outputs(
                self.model(**self.with_decoder_inputs(inputs, labels)), labels, num_items_in_batch
            )
        }

    def with_decoder_inputs(self, inputs: dict, labels: torch.Tensor) -> dict:
        """``inputs`` plus the decoder inputs an encoder-decoder model derives from its labels
        (the shifted labels), since the cross-entropy calls the model without them."""
        if "decoder_input_ids" in inputs or "decoder_inputs_embeds" in inputs:
            return inputs
        prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
        if prepare is not None:
            return {**inputs, "decoder_input_ids": prepare(labels=labels)}
        if _derives_decoder_inputs_in_forward(self.model):
            # Blenderbot, M2M100, NLLB-MoE, SeamlessM4T's text-to-text... shift their labels inside
            # forward and have no prepare method (so DataCollatorForSeq2Seq adds no decoder inputs
            # either): they get the labels, as under the Trainer. The loss they then compute
            # from them is not returned, so the export's dead-code pass drops it from the graph.
            return {**inputs, "labels": labels}
        return inputs

    def token_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels as the loss sees them: flattened, shifted for a causal LM."""
        if self.shift_labels:
            # As transformers' ForCausalLMLoss: pad then shift the labels, leave logits whole.
            labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        return labels.reshape(-1)

    def label_density(self, labels: torch.Tensor) -> float:
        """Share of the label positions the loss uses (after the causal shift)."""
        return float((self.token_labels(labels) != IGNORE_INDEX).float().mean())

    def loss_from_outputs(
        self, outputs, labels: torch.Tensor, num_items_in_batch=None, in_pytorch: bool = False
    ) -> torch.Tensor:
        """The cross-entropy of ``forward``, from the model's outputs; ``in_pytorch``: computed
        outside the ORT graph (the same loss through :mod:`.dense_cross_entropy` on CPU)."""
        if not self.takes_num_items:
            num_items_in_batch = None
        logits = _output(outputs, "logits")
        logits = logits.float().reshape(-1, logits.shape[-1])
        labels = self.token_labels(labels).to(logits.device)
        if in_pytorch and not self.label_smoothing:
            loss = summed_cross_entropy(logits, labels, IGNORE_INDEX)
        else:
            loss = self.loss_fct(logits, labels)
        if self.label_smoothing:
            # As transformers' LabelSmoother: (1-eps) * nll + eps * mean over classes of -log p,
            # both over the non-ignored positions.
            neg_log_probs = -nn.functional.log_softmax(logits, dim=-1).sum(dim=-1)
            smooth = neg_log_probs.masked_fill(labels == IGNORE_INDEX, 0.0).sum() / logits.shape[-1]
            loss = (1 - self.label_smoothing) * loss + self.label_smoothing * smooth
        return _per_item(loss, labels, num_items_in_batch)

    def chunked_head_loss(self, inputs: dict, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """The cross-entropy of ``forward`` from the backbone's last hidden states and the LM head's
        weights, fused and in row chunks (:mod:`.chunked_lm_loss`): the logits are never built."""
        if not self.takes_num_items:
            num_items_in_batch = None
        model = base_model(self.model)
        hidden = _output(getattr(model, model.base_model_prefix)(**inputs), "last_hidden_state")
        head = model.get_output_embeddings()
        labels = self.token_labels(labels).to(hidden.device)
        summed = chunked_linear_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,
            head.bias,
            labels,
            IGNORE_INDEX,
            self.head_threads,
            self.head_product,
        )
        return _per_item(summed, labels, num_items_in_batch)

    def is_class_label(self, labels: torch.Tensor | None) -> bool:
        """Whether ``labels`` are class ids the cross-entropy can take (not regression or
        multi-label targets)."""
        if labels is None or labels.is_floating_point():
            return False
        config = getattr(self.model, "config", None)
        problem = getattr(config, "problem_type", None)
        if problem in ("regression", "multi_label_classification"):
            return False
        if problem is None and type(self.model).__name__.endswith("ForSequenceClassification"):
            return getattr(config, "num_labels", 2) != 1
        return True


class LossInPyTorch:
    """The engine module returning logits, and ModuleWithLoss's cross-entropy on them in PyTorch:
    what the parent's ``compute_loss`` calls as the model when the loss stays out of the graph."""

    def __init__(self, engine_module: nn.Module, loss_module: ModuleWithLoss):
        self.engine_module, self.loss_module = engine_module, loss_module

    def __call__(self, labels=None, num_items_in_batch=None, **inputs):
        outputs = self.engine_module(labels=labels, **inputs)  # labels: an encoder-decoder builds its decoder inputs
        loss = self.loss_module.loss_from_outputs(outputs, labels, num_items_in_batch, in_pytorch=True)
        return {"loss": loss, **outputs}


def _per_item(summed: torch.Tensor, labels: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    """A summed loss over ``labels`` divided by ``num_items_in_batch`` (the Trainer's count over the
    accumulated batch), or by the labels counted here when it is None."""
    if num_items_in_batch is None:
        num_items_in_batch = (labels != IGNORE_INDEX).sum()
    elif torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(summed.device)
    return summed / num_items_in_batch


def _output(outputs, key: str) -> torch.Tensor:
    """``outputs[key]`` of a ModelOutput / dict, or the first element of a tuple output."""
    return outputs[key] if isinstance(outputs, dict) else outputs[0]


def model_loss(outputs, inputs) -> torch.Tensor:
    """The loss a model returned, read as the Trainer reads it; a clear error when there is none."""
    if isinstance(outputs, dict) and outputs.get("loss") is None:
        raise ValueError(
            "The model did not return a loss from the inputs, only the following keys: "
            f"{','.join(k for k in outputs.keys() if k != 'loss')}. For reference, the inputs it received are "
            f"{','.join(inputs.keys())}. Give it its labels (label_names), or a compute_loss_func."
        )
    return outputs["loss"] if isinstance(outputs, dict) else outputs[0]


def missing_labels_error(batch) -> ValueError:
    return ValueError(
        "ModuleWithLoss needs `labels` in every training batch for its cross-entropy, and this batch has "
        f"none (keys: {', '.join(sorted(batch))}). Add labels to the dataset / collator, set label_names if "
        "they are called differently, or set use_module_with_loss=False."
    )


def _derives_decoder_inputs_in_forward(model: nn.Module) -> bool:
    """Whether ``model`` is an encoder-decoder whose forward builds its decoder inputs from ``labels``
    (it takes both, and has no ``prepare_decoder_input_ids_from_labels`` to build them apart)."""
    import inspect

    inner = base_model(model)
    if not getattr(getattr(inner, "config", None), "is_encoder_decoder", False):
        return False
    params = inspect.signature(inner.forward).parameters
    return "labels" in params and "decoder_input_ids" in params


def _is_causal_lm(model: nn.Module) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(base_model(model)).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


def _identity(function) -> str | None:
    """``function`` by its address, unique to this process: what it computes can hang on values
    its source does not show (a closure's class weights), so no graph with it is reused by
    another run."""
    return (
        None
        if function is None
        else f"{getattr(function, '__qualname__', type(function).__qualname__)}@{id(function):x}"
    )


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (LoRA...), or ``model`` itself."""
    if type(model).__module__.startswith("peft.") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model
