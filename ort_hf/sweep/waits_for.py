"""What each model type the sweep does not train at parity waits for: the diagnosis, written once,
rendered into docs/architectures.md next to the cells it explains (``render._waiting``)."""

from __future__ import annotations

_LENGTH_BAKED_SCAN = (
    "its recurrence runs as a Python loop over the sequence in PyTorch's CPU path, so the "
    "trace unrolls it to the first batch's length (refused before training by the pre-flight); "
    "needs an ONNX Loop/Scan export with a gradient, which ORT 1.19.2 does not have"
)
_LENGTH_BAKED_WINDOW = (
    "its attention pads the sequence to a window multiple computed in Python from the first "
    "batch's length, which the trace keeps as constants (refused before training by the "
    "pre-flight); needs that padding computed from the input's shape in the graph"
)
_LENGTH_BAKED_CHUNKS = (
    "its state-space scan (PyTorch's path) pads the sequence to a multiple of its chunk size by a "
    "`pad_size` computed in Python from the first batch's length, which the trace keeps as a constant "
    "(refused before training by the pre-flight); needs that padding computed from the input's shape "
    "in the graph"
)

_FLIP_OF_UNFOLD = (
    "its short convolution flips an unfolded window (`x.unfold(-1, k, 1).flip(-1)`), and ORT 1.19.2's "
    'SliceGrad for that flip fails ("narrowing_error"); a flip exported as a Gather of reversed '
    "indices gets past it but the forward then sizes the axis 0. Not yet repaired"
)

WAITS_FOR: dict[str, str] = {
    "afmoe": "not diagnosed: ORT's loss differs from PyTorch's on the first batch itself (3.6e-3), so the "
    "pre-flight refuses it",
    "bamba": _LENGTH_BAKED_CHUNKS,
    "cpmant": "its segment and position buckets are computed in Python from the first batch's length, kept as "
    "constants by the trace (refused by the pre-flight); needs them computed in the graph",
    "falcon_h1": _LENGTH_BAKED_CHUNKS,
    "falcon_mamba": _LENGTH_BAKED_SCAN,
    "funnel": "its pooling computes attention-mask and position sizes in Python from the first batch's length, "
    "kept as constants by the trace (refused by the pre-flight)",
    "granitemoehybrid": _LENGTH_BAKED_CHUNKS,
    "hrm_text": "its low-level cycles before the gradient threshold run under `torch.no_grad()`, which the "
    "TorchScript exporter does not record, so ORT differentiates through them (gradients 0.29 off; "
    "refused by the pre-flight); needs a stop-gradient at the no-grad boundary",
    "inkling2_loop_text": _FLIP_OF_UNFOLD,
    "inkling2_text": _FLIP_OF_UNFOLD,
    "jamba": _LENGTH_BAKED_SCAN,
    "jetmoe": "not diagnosed: the pre-flight finds ORT's loss 8e-4 from PyTorch's on a copy of the first batch "
    "5 columns longer (the sweep's own batches of other lengths agree, with the pre-flight off)",
    "led": _LENGTH_BAKED_WINDOW,
    "llama4_text": "`torch.polar` (complex rotary embedding): ORT has no complex tensors; needs the rotation "
    "written in real cosine and sine ops",
    "longformer": _LENGTH_BAKED_WINDOW,
    "mamba": _LENGTH_BAKED_SCAN,
    "mamba2": _LENGTH_BAKED_CHUNKS,
    "recurrent_gemma": _LENGTH_BAKED_SCAN,
    "rwkv": _LENGTH_BAKED_SCAN,
    "t5gemma2": "its attention masks are built by `torch.func.vmap` over a mask function, which the exporter "
    "keeps as a Python op ORT cannot run; needs the masks exported as plain ops",
    "xlstm": _LENGTH_BAKED_SCAN,
}


def waits_for(model_type: str) -> str:
    return WAITS_FOR.get(model_type, "not diagnosed yet")
