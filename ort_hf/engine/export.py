"""Deployable output: an inference ONNX model of a trained model, checked in onnxruntime."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .errors import ORTFallbackError

logger = logging.getLogger(__name__)
MODEL_FILE = "model.onnx"
# Inference exports; the training export has its own (ORTOptions.opset_version, 16).
INFERENCE_OPSET = 17


class ExportVerificationError(RuntimeError):
    """The exported ONNX model does not reproduce PyTorch's outputs."""


class _NamedOutputs(nn.Module):
    """The model with positional inputs and a tuple of its tensor outputs (``output_names``),
    as the exporter needs them; caches are turned off (inference exports take no past state)."""

    def __init__(self, model: nn.Module, input_names: list[str]):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.no_cache = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
        self.output_names: list[str] = []

    def outputs(self, *tensors) -> dict[str, torch.Tensor]:
        output = self.model(**dict(zip(self.input_names, tensors)), **self.no_cache)
        if not isinstance(output, dict):
            return {"logits": output[0]}
        return {k: v for k, v in output.items() if torch.is_tensor(v) and k != "loss"}

    def forward(self, *tensors):
        outputs = self.outputs(*tensors)
        return tuple(outputs[name] for name in self.output_names)


def _session(path: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def export_inference_onnx(
    model: nn.Module,
    sample_inputs: dict[str, torch.Tensor],
    output_dir: str | Path,
    opset_version: int = INFERENCE_OPSET,
    atol: float = 1e-4,
    check_inputs: list[dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Export ``model`` (eval mode) to ``output_dir/model.onnx`` with every tensor it outputs, by
    name (``logits``; ``start_logits`` / ``end_logits`` for QA; ...), dynamic batch and sequence
    axes; then run it in onnxruntime on ``sample_inputs`` and ``check_inputs`` and raise
    :class:`ExportVerificationError` unless every output matches PyTorch within ``atol``."""
    from .runtime import ensure_engine, register_symbolics

    register_symbolics(ensure_engine(), opset_version)  # SDPA and friends, as for training
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / MODEL_FILE
    names = [k for k, v in sample_inputs.items() if torch.is_tensor(v) and k not in ("labels", "num_items_in_batch")]
    cpu_inputs = {k: sample_inputs[k].detach().cpu() for k in names}
    was_training = model.training
    device = next(model.parameters()).device
    model.eval().to("cpu")
    wrapper = _NamedOutputs(model, names).eval()  # the exporter restores this mode on the model after export
    # An encoder-decoder's decoder inputs have their own length (an axis of one name must be one size).
    axis = {name: "decoder_sequence" if name.startswith("decoder_") else "sequence" for name in names}
    dynamic = {name: {0: "batch", 1: axis[name]} for name in names if cpu_inputs[name].dim() >= 2}
    try:
        with torch.no_grad():
            sample_outputs = wrapper.outputs(*(cpu_inputs[n] for n in names))
        wrapper.output_names = list(sample_outputs)
        lengths = {cpu_inputs[n].shape[1]: axis[n] for n in reversed(names) if cpu_inputs[n].dim() >= 2}
        for name, value in sample_outputs.items():  # per-token outputs follow their input's sequence length
            length = value.shape[1] if value.dim() >= 2 else None
            dynamic[name] = {0: "batch", 1: lengths[length]} if length in lengths else {0: "batch"}
        with torch.no_grad():
            torch.onnx.export(
                wrapper,
                tuple(cpu_inputs[n] for n in names),
                str(path),
                input_names=names,
                output_names=wrapper.output_names,
                dynamic_axes=dynamic,
                opset_version=opset_version,
                do_constant_folding=True,
                dynamo=False,
            )
        session = _session(path)
        for inputs in [
            cpu_inputs,
            *[{k: v.detach().cpu() for k, v in c.items() if k in names} for c in check_inputs or []],
        ]:
            with torch.no_grad():
                expected = wrapper(*(inputs[n] for n in names))
            got = session.run(wrapper.output_names, {n: inputs[n].numpy() for n in names})
            for name, want, have in zip(wrapper.output_names, expected, got):
                want = want.float().numpy()
                diff = float(np.max(np.abs(have - want))) if have.shape == want.shape else float("inf")
                if diff > atol:
                    raise ExportVerificationError(
                        f"{path}: onnxruntime's {name} differs from PyTorch's (shape {have.shape} vs {want.shape}, "
                        f"max abs diff {diff:.2e} > {atol:g}); the file was written but should not be deployed."
                    )
    except (RuntimeError, torch.onnx.errors.OnnxExporterError) as exc:
        if isinstance(exc, ExportVerificationError):
            raise
        raise ORTFallbackError(f"Exporting {type(model).__name__} for inference failed: {exc}") from exc
    finally:
        model.train(was_training).to(device)
    logger.info("ort_hf: exported %s and checked it in onnxruntime (atol %g)", path, atol)
    return path
