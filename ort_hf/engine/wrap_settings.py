"""What a wrapped model's forward reads from its options, resolved for the model and where it trains,
and the first step's line saying which of ort_hf's rewrites and kernels run for it and why."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

from . import placement
from .options import ORTOptions
from .proven import inner_model, padding_rewrite_proven, proven_exact
from .runtime import EngineState
from .swap_switches import CORRECTIONS, SWITCHES, switched_on


@dataclass(frozen=True)
class WrapSettings:
    """What a wrapped model's forward reads from its options, resolved for the model: built by
    :meth:`of` in the constructor and again, whole, on ``reconfigure``."""

    options: ORTOptions
    device_type: str  # "cpu" or "cuda": where the parameters were when these settings were resolved
    pythonop: bool  # torch.autograd.Function runs as ORT PythonOp (asked for, and the extension is there)
    trim_padding: bool
    eliminate_padding: bool
    preflight: bool  # check ORT against PyTorch before the first step (preflight.py)
    disable_cache: bool  # ORT cannot return a DynamicCache (ORTModuleIOError: Unsupported flatten data type)
    targets_apart: bool  # a seq2seq generator: labels and decoder_* inputs follow the target (padding.decoder_side)

    @property
    def on_cuda(self) -> bool:
        return self.device_type == "cuda"

    @classmethod
    def of(cls, module: nn.Module, options: ORTOptions, state: EngineState) -> WrapSettings:
        device_type = placement.model_device_type(module)
        on_cuda = device_type == "cuda"
        if on_cuda and options.eliminate_padding:
            raise ValueError(
                "ort_hf: eliminate_padding is the CPU build's stand-in for ORT's own padding "
                "elimination, which its CUDA build runs (enable_embedding_sparsity); it has never run "
                "on a GPU. Leave eliminate_padding unset on CUDA."
            )
        config = getattr(module, "config", None)

        # The padding rewrites change what a model computes wherever it reads a padding position
        # (a convolution or pooling over the sequence, a loss over positions): by default they run
        # only for the classes the sweep proved they leave exact (proven.py), each rewrite on its own.
        def default(rewrite: str, asked: bool | None) -> bool:
            return asked if asked is not None else not on_cuda and padding_rewrite_proven(module, rewrite)

        return cls(
            options=options,
            device_type=device_type,
            pythonop=state.pythonop_available and options.enable_custom_autograd,
            trim_padding=default("trim_padding", options.trim_padding),
            eliminate_padding=default("eliminate_padding", options.eliminate_padding),
            preflight=options.preflight == "always" or (options.preflight == "auto" and not proven_exact(module)),
            disable_cache="use_cache" in inspect.signature(module.forward).parameters
            and bool(getattr(config, "use_cache", False)),
            targets_apart=_generates_targets(inner_model(module)),
        )


def _generates_targets(model: nn.Module) -> bool:
    """A sequence-to-sequence generator (an encoder-decoder config, and ``generate``): its labels and
    ``decoder_*`` inputs are the target's. Not every class of an encoder-decoder config is one: T5's
    and T5Gemma's token classifiers label ``input_ids``'s positions."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and callable(getattr(model, "generate", None))


def rewrites_line(name: str, settings: WrapSettings, swaps: frozenset[str]) -> tuple[bool, str]:
    """The first step's line saying which of ort_hf's rewrites and kernels run for model class ``name``
    and why; True when the padding rewrites are off only for want of proof (a warning, not news)."""
    options, device = settings.options, settings.device_type
    if device != "cpu" and options.trim_padding is None and options.eliminate_padding is None:
        padding = f"padding trim and elimination off on {device} (ORT's own padding elimination runs there)"
    else:
        padding = " and ".join(
            _rewrite_state(label, on, asked, flag)
            for label, on, asked, flag in (
                ("padding trim", settings.trim_padding, options.trim_padding, "--ort_trim_padding"),
                (
                    "padding elimination",
                    settings.eliminate_padding,
                    options.eliminate_padding,
                    "--ort_eliminate_padding",
                ),
            )
        )
    if device != "cpu":
        kernels = f"ort_hf's kernels off (CPU-only; ORT's own {device} kernels run)"
    else:
        on = sorted(swaps - CORRECTIONS)
        off = [
            f"{swap} (recompute keeps ORT's)"
            if switched_on(options, SWITCHES[swap])
            else f"{swap} (--ort_{SWITCHES[swap]} false)"
            if getattr(options, SWITCHES[swap]) is not None
            else f"{swap} (not on this CPU; --ort_{SWITCHES[swap]} true forces it)"
            for swap in sorted(set(SWITCHES) - swaps)
        ]
        kernels = (
            f"ort_hf's CPU kernels on: {', '.join(on) or 'none'}; off: {', '.join(off) or 'none'}; "
            f"corrections of ORT's CPU kernels (always): {', '.join(sorted(CORRECTIONS))}"
        )
    unproven = (
        device == "cpu"
        and options.trim_padding is None
        and options.eliminate_padding is None
        and not (settings.trim_padding or settings.eliminate_padding)
    )
    return unproven, f"ort_hf: {name} trains on {device}: {padding}; {kernels}."


def _rewrite_state(label: str, on: bool, asked: bool | None, flag: str) -> str:
    if asked is not None:
        return f"{label} {'on' if on else 'off'} ({flag})"
    if on:
        return f"{label} on (the architecture sweep proved it exact for it: docs/architectures.md)"
    return (
        f"{label} off (the architecture sweep has not proven it exact for it: docs/architectures.md; "
        f"{flag} true forces it)"
    )
