"""What TRL's online trainers (GRPO, RLOO) need from ORT beyond the mixin: generation on the
PyTorch model, the config handed over without its derived fields, and the refusals.

Generation sees the trained weights because there is only one copy of them: ORTModule takes the
torch parameters of ``trainer.model`` as graph inputs on every step (no copy into the session),
writes their ``.grad``, and the optimizer updates them in place. ``generate`` runs on that same
``trainer.model`` in PyTorch, so the completions sampled after optimizer step k come from the
weights of step k.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

# GRPOConfig / RLOOConfig derive one of these from the other in __post_init__ and refuse both set.
_DERIVED_BATCH_FIELD = "generation_batch_size"


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


def as_ort_online_config(trl_trainer_cls: type, trl_config_cls: type, ort_config_cls: type, args: tuple,
                         kwargs: dict):
    """``args`` / ``kwargs`` of ``trl_trainer_cls.__init__`` with a plain ``trl_config_cls`` turned into
    ``ort_config_cls``, and the config (None if not given). Its ``generation_batch_size`` is left out: ``__post_init__`` derived it from
    ``steps_per_generation`` (or the other way round), and passing both back is refused by TRL;
    from ``steps_per_generation`` alone it derives the same value again."""
    signature = inspect.signature(trl_trainer_cls.__init__)
    try:
        bound = signature.bind_partial(None, *args, **kwargs)
    except TypeError:
        return args, kwargs, None  # TRL raises its own error for a wrong call
    config = bound.arguments.get("args")
    if config is None or isinstance(config, ort_config_cls) or not isinstance(config, trl_config_cls):
        return args, kwargs, config
    known = {f.name for f in dataclasses.fields(ort_config_cls) if f.init}
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.init and f.name in known and f.name != _DERIVED_BATCH_FIELD}
    bound.arguments["args"] = config = ort_config_cls(**values)
    return bound.args[1:], bound.kwargs, config


def refuse_online_options(args, trainer_name: str) -> None:
    """Before TRL's ``__init__`` (which would import vLLM or patch the model): what ORT cannot run."""
    if not args.use_ort:
        return
    if getattr(args, "use_vllm", False):
        raise ValueError(f"use_vllm=True with {trainer_name}: vLLM generates from its own copy of the weights on a "
                         "GPU, synced from the model each step; ort_hf generates with transformers' generate on the "
                         "model ORT trains. Pass use_vllm=False (the default), or train with the plain TRL trainer "
                         "(use_ort=False).")
    if args.use_liger_kernel:
        raise ValueError(f"use_liger_kernel=True with {trainer_name}: Liger's kernels are Triton kernels that ORT "
                         "cannot export into its graph. Drop use_liger_kernel (ORT's graph optimiser fuses kernels itself), or "
                         "train with the plain TRL trainer (use_ort=False).")
