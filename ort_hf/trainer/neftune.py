"""NEFTune (``neftune_noise_alpha``) in a form ORT can export.

transformers' hook draws the noise with ``zeros_like(x).uniform_(-m, m)``: ``aten::uniform`` has
no ONNX symbolic, so the export fails, and its magnitude ``alpha / sqrt(seq * hidden)`` is
computed from Python ints that a trace freezes at the export's sequence length. This hook draws
the same distribution with ``rand_like`` (ONNX ``RandomUniformLike``, from ORT's generator,
which ORTTrainer seeds per step as for dropout) and takes ``seq * hidden`` from the tensor, so
the magnitude follows each batch's length as in PyTorch.
"""

from __future__ import annotations

import torch


def exportable_neftune_hook(module, inputs, output):
    if module.training:
        size = torch.ones_like(output[0]).sum()  # seq * hidden, computed in the graph
        magnitude = module.neftune_noise_alpha / torch.sqrt(size)
        output = output + (torch.rand_like(output) * 2 - 1) * magnitude
    return output


def use_exportable_neftune(model, handle):
    """Replace the Trainer's NEFTune hook (``handle``) by :func:`exportable_neftune_hook` on the
    same embedding module; returns the new handle, which the Trainer's ``deactivate_neftune``
    removes as it would its own."""
    if getattr(handle, "_ort_hf_neftune", False):
        return handle
    from ..module_with_loss.module_with_loss import base_model

    base = base_model(model)
    handle.remove()
    new = base.get_input_embeddings().register_forward_hook(exportable_neftune_hook)
    new._ort_hf_neftune = True
    return new
