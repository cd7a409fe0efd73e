"""``export_onnx`` for ORTTrainerMixin: the trained model as an inference ONNX model, fed what an
inference caller has (the sample batch without the inputs the trainer treats as labels)."""

from __future__ import annotations

import inspect

import torch
from transformers.utils import find_labels

from ..module_with_loss.module_with_loss import base_model


def label_inputs(model, label_names) -> set[str]:
    """The inputs a trainer treats as labels: its ``label_names`` and the model's own label arguments
    (``labels``; ``start_positions`` / ``end_positions`` for question answering...)."""
    return {*(label_names or ()), *find_labels(type(base_model(model))), "labels", "num_items_in_batch"}


def inference_inputs(model, batch: dict, label_names) -> dict[str, torch.Tensor]:
    """The tensors of a training ``batch`` an inference model takes: the label inputs left out, and
    inputs the model's forward does not name (a trainer's own columns, e.g. TRL's ``completion_mask``)
    too; an encoder-decoder gets the ``decoder_input_ids`` its labels stood for."""
    model = base_model(model)
    params = inspect.signature(model.forward).parameters
    named = {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    labels = label_inputs(model, label_names)
    inputs = {k: v for k, v in batch.items() if torch.is_tensor(v) and k in named and k not in labels}
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if (
        prepare is not None
        and torch.is_tensor(batch.get("labels"))
        and "decoder_input_ids" in named
        and "decoder_input_ids" not in inputs
    ):
        inputs["decoder_input_ids"] = prepare(labels=batch["labels"])
    return inputs


def export_trained_onnx(trainer, output_dir: str, sample_inputs: dict | None, opset_version: int) -> str:
    """What ``ORTTrainerMixin.export_onnx`` documents."""
    from ..engine import export_inference_onnx

    if sample_inputs is None:
        dataset = trainer.eval_dataset if trainer.eval_dataset is not None else trainer.train_dataset
        if isinstance(dataset, dict):
            dataset = next(iter(dataset.values()))
        loader = trainer.get_eval_dataloader(dataset) if dataset is not None else None
        if loader is None:
            raise ValueError("export_onnx needs sample_inputs or a train/eval dataset to take one batch from.")
        sample_inputs = next(iter(loader))
    batch = inference_inputs(trainer.model, dict(sample_inputs), trainer.label_names)
    half = {k: v[: max(1, len(v) // 2)] for k, v in batch.items()}  # a second batch size checks the dynamic axes
    path = export_inference_onnx(trainer.model, batch, output_dir, opset_version, check_inputs=[half])
    trainer.model.config.save_pretrained(output_dir)
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(output_dir)
    return str(path)
