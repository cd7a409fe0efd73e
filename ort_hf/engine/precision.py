"""Which precisions ORT 1.19.2 can train in, checked before any graph is built.

bfloat16 on CUDA is refused. ORT 1.19.2's CUDA provider registers no bfloat16 kernel for ops a
bf16 training graph contains (ReduceMax in the SDPA attention export, ReluGrad, ReduceMean,
DivGrad, Pow, ...; read from the provider binary's kernel classes and ORT's kernel
registrations), and its CPU provider has none either, so creating the training session would fail
(or, with fallback, train in PyTorch). fp16 has those kernels. Allowing bf16 would take an fp32
ReduceMax in the SDPA symbolic, a check of the built graph's bf16 nodes against the missing set,
and one run on an Ampere-or-newer GPU.
"""

from __future__ import annotations

import torch

BF16_ON_CUDA = (
    "bfloat16 with ORT on CUDA: onnxruntime-training 1.19.2 has no bfloat16 CUDA kernel for several ops a bf16 "
    "training graph contains (ReduceMax in the attention export, ReluGrad, ReduceMean, DivGrad, ...), so ORT could "
    "not create the training session. Train with --fp16 through ORT, or with --bf16 in PyTorch (--use_ort false)."
)


def check_precision(module: torch.nn.Module) -> None:
    """Raise before the first export when ``module`` would train in bfloat16 on CUDA (autocast to
    bfloat16, or bfloat16 weights)."""
    autocast_bf16 = torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
    weights_bf16 = any(p.is_cuda and p.dtype == torch.bfloat16 for p in module.parameters())
    if autocast_bf16 or weights_bf16:
        raise ValueError(BF16_ON_CUDA)
