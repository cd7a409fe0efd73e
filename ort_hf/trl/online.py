"""What TRL's online trainers (GRPO, RLOO) need from ORT beyond the mixin: generation on the
PyTorch model, and the refusals (their configs' derived batch fields are the mixin's
``parent_binding.given_values``).

Generation sees the trained weights because there is only one copy of them: ORTModule takes the
torch parameters of ``trainer.model`` as graph inputs on every step (no copy into the session),
writes their ``.grad``, and the optimizer updates them in place. ``generate`` runs on that same
``trainer.model`` in PyTorch, so the completions sampled after optimizer step k come from the
weights of step k.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def generation_on_torch_model(trainer):
    """TRL generates with ``unwrap_model_for_generation(self.model_wrapped)``; through ORT
    ``model_wrapped`` is the engine module, which has no ``generate``. For the call, TRL is handed
    the PyTorch model the engine trains (same parameter tensors)."""
    wrapped = trainer.model_wrapped
    trainer.model_wrapped = trainer.model
    try:
        yield
    finally:
        trainer.model_wrapped = wrapped


def refuse_online_options(args, trainer_name: str) -> None:
    """Before TRL's ``__init__`` (which would import vLLM or patch the model): what ORT cannot run."""
    if not args.use_ort:
        return
    if getattr(args, "use_vllm", False):
        raise ValueError(
            f"use_vllm=True with {trainer_name}: vLLM generates from its own copy of the weights on a "
            "GPU, synced from the model each step; ort_hf generates with transformers' generate on the "
            "model ORT trains. Pass use_vllm=False (the default), or train with the plain TRL trainer "
            "(use_ort=False)."
        )
    if args.use_liger_kernel:
        raise ValueError(
            f"use_liger_kernel=True with {trainer_name}: Liger's kernels are Triton kernels that ORT "
            "cannot export into its graph. Drop use_liger_kernel (ORT's graph optimiser fuses kernels itself), or "
            "train with the plain TRL trainer (use_ort=False)."
        )
