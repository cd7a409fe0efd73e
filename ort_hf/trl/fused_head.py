"""TRL's fused LM head, as ORTTrainerMixin finds it on a model: what TRL told it, read once.

TRL (``trl.trainer.utils.add_fused_lm_head``) patches the model's ``forward`` so that
``model(..., labels=..., fused_lm_head=True)`` returns per-token log-probabilities. The head's
settings (temperature, fp32 head, which outputs; soft-capping, logit scale and backbone derived
from the config) are nowhere public after the patch: TRL keeps no attribute of them, and the
trainers that call ``add_fused_lm_head`` pass them as arguments. The only place they exist is the
closure of the ``_fused_forward`` it installs, so :func:`_closure_settings` reads them there, for
the trl range ort_hf declares (``ort_hf/_versions.py``, pyproject's ``trl`` extra), and refuses a
head it cannot read. Nothing here imports TRL until a model carries its head.
"""

from __future__ import annotations

import os

from torch import nn

from ..module_with_loss.fused_lm_head import OPTIONAL_OUTPUTS, HeadSettings
from ..module_with_loss.module_with_loss import base_model

# The free variables of add_fused_lm_head's _fused_forward this code reads (trl 1.16's names).
_CLOSURE_NAMES = (
    "temperature",
    "cast_lm_head_to_fp32",
    "outputs",
    "final_logit_softcapping",
    "logit_scale",
    "backbone_attr",
    "text_config",
)
_TRL_UTILS = os.path.join("trl", "trainer", "utils.py")  # where add_fused_lm_head and its _fused_forward live


def _trl_forward(model: nn.Module):
    """The ``_fused_forward`` TRL installed on ``model`` (the instance's own ``forward``), or None."""
    func = getattr(vars(model).get("forward"), "__func__", None)
    code = getattr(func, "__code__", None)
    # functools.wraps gives it the model class's __name__ and __qualname__; its code keeps TRL's.
    if code is None or code.co_name != "_fused_forward" or not code.co_filename.endswith(_TRL_UTILS):
        return None
    return func


def has_trl_fused_head(model: nn.Module) -> bool:
    """Whether TRL's fused head is on ``model`` (through any PEFT wrapper)."""
    return _trl_forward(base_model(model)) is not None


def _tested_trl() -> str:
    from .._versions import tested_ranges

    return f"trl{tested_ranges().get('trl', '')}"


def _closure_settings(func) -> dict:
    """The settings in the closure of TRL's ``_fused_forward``: the one read of TRL internals here,
    written against the trl range of :func:`_tested_trl` (1.16). Raises, naming that range, when the
    closure does not hold what this code computes."""
    cells = dict(zip(func.__code__.co_freevars, (c.cell_contents for c in func.__closure__ or ())))
    missing = [name for name in _CLOSURE_NAMES if name not in cells]
    outputs = cells.get("outputs", ())
    if missing or not set(outputs) <= {"log_probs", *OPTIONAL_OUTPUTS}:
        from importlib.metadata import version

        raise RuntimeError(
            f"TRL's fused LM head (trl {version('trl')}) is not the one ort_hf reads (missing "
            f"{missing or 'none'}, outputs {outputs}); ort_hf is tested with {_tested_trl()}: "
            f"pip install '{_tested_trl()}', or train with the plain TRL trainer (use_ort=False)."
        )
    return cells


def read_head_settings(model: nn.Module) -> HeadSettings:
    """The settings of the fused head TRL added to ``model`` (the transformers model, inside any PEFT
    wrapper). Raises if TRL added none, or its head is not one this code reads."""
    func = _trl_forward(model)
    if func is None:
        raise ValueError(
            f"{type(model).__name__} has no TRL fused LM head (trl.trainer.utils.add_fused_lm_head): "
            "the ORT TRL trainers compute the head TRL's trainers add in their __init__."
        )
    cells = _closure_settings(func)
    from trl.trainer.utils import FusedCausalLMOutput

    return HeadSettings(
        temperature=float(cells["temperature"]),
        cast_lm_head_to_fp32=bool(cells["cast_lm_head_to_fp32"]),
        outputs=tuple(cells["outputs"]),
        final_logit_softcapping=cells["final_logit_softcapping"],
        logit_scale=float(cells["logit_scale"]),
        backbone_attr=cells["backbone_attr"],
        moe_router_logits=bool(getattr(cells["text_config"], "output_router_logits", False)),
        output_type=FusedCausalLMOutput,
    )


def fused_head_of(model: nn.Module, args) -> HeadSettings | None:
    """The settings of TRL's fused LM head on ``model`` (through any PEFT wrapper), or None when it
    has none or ORT is off. Refuses, before training, what the graph does not compute."""
    base = base_model(model)
    if not args.use_ort or _trl_forward(base) is None:
        return None
    if args.ort_eval_in_ort:
        raise ValueError(
            "--ort_eval_in_ort with TRL's fused LM head: evaluation runs TRL's head in PyTorch; "
            "drop the flag (training still runs through ORT)."
        )
    settings = read_head_settings(base)
    if settings.moe_router_logits:
        raise ValueError(
            f"{type(base).__name__} asks for MoE router logits (TRL adds the load-balancing loss to the "
            "fused head's): not computed through ORT by ort_hf. Pass router_aux_loss_coef=0.0 to the "
            "config, or train with the plain TRL trainer (use_ort=False)."
        )
    return settings
