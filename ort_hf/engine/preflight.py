"""The pre-flight: before a model the sweep has not proven trains, ORT's graph must give PyTorch's
numbers on the first batch and on a longer copy of it.

It runs in a session of its own (exported with the model's dropout turned off, released after),
before the first optimizer step, and compares one forward and backward in each engine:

* the objective: the ``loss`` the model returns, or else a fixed random projection of every float
  output (at real positions only), so the check covers what a loss computed outside the graph reads;
* every parameter's gradient of it, as one relative error.

The longer copy appends copies of the first columns (real tokens, their labels) to every tensor
laid out as the batch's tokens, and has one row fewer: a graph that baked the first batch's size
into a constant (a ``Gather`` whose indices go out of range, a wrong relative-position table, a
loop unrolled over the first batch's positions) fails here instead of mid-run. Where the model's
positions cannot grow, the copy is shorter instead.

A failure raises :class:`PreflightMismatch`; the wrapped model's fallback policy then decides, as
for an export failure: PyTorch trains it (``fallback='auto'``, said before training) or the run
stops (``'disable'``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Mapping

import torch
from torch import nn

from .._model_state import buffer_values, restore_buffers
from .errors import ORTFallbackError

logger = logging.getLogger(__name__)

# Float32 ORT against PyTorch on the same graph: losses agree to ~1e-6 and gradients to ~1e-5
# relative on the sweep's models; a graph that computes something else is far outside both.
LOSS_ATOL, LOSS_RTOL = 2e-5, 2e-5
GRAD_RTOL = 1e-3
# Columns appended for the second length (a quarter more, at least 3).
_GROW_FRACTION, _GROW_MIN = 0.25, 3


_FIRST = "the first batch"


class PreflightMismatch(RuntimeError):
    """ORT's graph did not give PyTorch's numbers on the pre-flight batches."""


@dataclasses.dataclass
class _Pass:
    objective: float
    grads: list[torch.Tensor | None]


def run_preflight(module: nn.Module, wrap, args: tuple, kwargs: dict) -> str:
    """Check ``wrap(module)`` (a fresh ORT training module, fallback disabled) against ``module`` in
    PyTorch on ``kwargs`` and a copy of another length. Returns a one-line summary; raises
    :class:`PreflightMismatch` naming the batch and what differed."""
    batches = [(_FIRST, kwargs)]
    other = _other_length(module, kwargs)
    if other is not None:
        batches.append(_other_rows(*other, kwargs))
    params = [p for p in module.parameters() if p.requires_grad]
    with _dropout_off(module), _state_kept(module, params):
        wrapped = wrap(module)
        try:
            wrapped.train()
            worst = 0.0
            start = buffer_values(module), torch.random.get_rng_state()
            for what, batch in batches:
                mask = _token_mask(batch)
                _restart(module, start)  # each pass from the same buffers (a forward may write them) and RNG
                ref = _one_pass(module, args, batch, params, mask)
                _restart(module, start)
                if ref is None:  # PyTorch itself cannot run this copy: nothing to compare
                    continue
                try:
                    got = _one_pass(wrapped, args, batch, params, mask, reference=False)
                except Exception as exc:
                    # Unwrapped from the check's own fallback-disabled error, so the caller's policy decides.
                    cause = exc.__cause__ if isinstance(exc, ORTFallbackError) and exc.__cause__ is not None else exc
                    if what == _FIRST:
                        raise cause from None  # what the training session's export would hit too
                    raise PreflightMismatch(_baked_length(what, cause)) from cause
                worst = max(worst, _compare(what, ref, got, params, module))
        finally:
            wrapped.release()
    lengths = " and ".join(what for what, _ in batches)
    return f"ORT matched PyTorch on {lengths} (gradient relative error {worst:.1e})"


def _restart(module: nn.Module, start) -> None:
    buffers, rng = start
    restore_buffers(module, buffers)
    torch.random.set_rng_state(rng)


def _baked_length(what: str, exc: Exception) -> str:
    from .failures import describe_failure

    return (
        f"pre-flight: ORT's graph, exported on the first batch, fails on {what}: a size of the first batch "
        f"is baked into it as a constant, so a batch of another length would crash or train wrongly "
        f"({describe_failure(exc)})"
    )


def _one_pass(net, args, batch, params, mask, reference=True) -> _Pass | None:
    try:
        out = net(*args, **batch)
    except Exception:
        if reference:
            return None
        raise
    objective = _objective(out, mask)
    grads = torch.autograd.grad(objective, params, allow_unused=True)
    return _Pass(float(objective.detach()), [None if g is None else g.detach().clone() for g in grads])


def _compare(what: str, ref: _Pass, got: _Pass, params, module) -> float:
    from .proven import model_class_name

    name = model_class_name(module)
    wrong = (
        "ORT's graph computes something else"
        if what == _FIRST
        else "the graph exported on the first batch holds a size of it as a constant and is wrong at another length"
    )
    if math.isfinite(ref.objective) and not math.isfinite(got.objective):
        raise PreflightMismatch(
            f"pre-flight: on {what}, ORT's loss of {name} is {got.objective} where PyTorch's is {ref.objective:.6g}"
        )
    if abs(ref.objective - got.objective) > LOSS_ATOL + LOSS_RTOL * abs(ref.objective):
        raise PreflightMismatch(
            f"pre-flight: on {what}, ORT's loss of {name} is {got.objective:.6g} where "
            f"PyTorch's is {ref.objective:.6g}: {wrong}"
        )
    diff = total = 0.0
    for p, r, g in zip(params, ref.grads, got.grads):
        r = torch.zeros_like(p) if r is None else r
        g = torch.zeros_like(p) if g is None else g
        diff += float((g.double() - r.double()).pow(2).sum())
        total += float(r.double().pow(2).sum())
    error = math.sqrt(diff / total) if total > 0 else math.sqrt(diff)
    if not math.isfinite(error) or error > GRAD_RTOL:
        raise PreflightMismatch(
            f"pre-flight: on {what}, ORT's gradients of {name} are {error:.2g} (relative) from PyTorch's: {wrong}"
        )
    return error


def _objective(out, mask: torch.Tensor | None) -> torch.Tensor:
    loss = _loss_of(out)
    if loss is not None:
        return loss
    generator = torch.Generator().manual_seed(0)
    total = None
    for tensor in _float_tensors(out):
        weights = torch.randn(tensor.shape, generator=generator, dtype=torch.float32).to(tensor.device, tensor.dtype)
        if mask is not None and tensor.dim() >= 2 and tuple(tensor.shape[:2]) == tuple(mask.shape):
            weights = weights * mask.reshape(*mask.shape, *([1] * (tensor.dim() - 2))).to(weights)
        term = (tensor * weights).sum()
        total = term if total is None else total + term
    if total is None:
        raise PreflightMismatch("pre-flight: the model returned no floating-point tensor to compare")
    return total


def _loss_of(out):
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if torch.is_tensor(loss) and loss.dim() == 0 and loss.requires_grad else None


def _float_tensors(out):
    if torch.is_tensor(out):
        if out.is_floating_point() and out.requires_grad:
            yield out
    elif isinstance(out, Mapping):
        for value in out.values():
            yield from _float_tensors(value)
    elif isinstance(out, (tuple, list)):
        for value in out:
            yield from _float_tensors(value)


def _token_mask(batch: dict) -> torch.Tensor | None:
    mask = batch.get("attention_mask")
    return mask if torch.is_tensor(mask) and mask.dim() == 2 else None


def _other_length(module: nn.Module, kwargs: dict):
    """A copy of the batch with columns appended (:func:`_grow`), or a shorter cut where positions are capped."""
    ids = kwargs.get("input_ids", kwargs.get("attention_mask"))
    if not torch.is_tensor(ids) or ids.dim() != 2:
        return None
    batch, length = ids.shape
    grow = max(_GROW_MIN, int(length * _GROW_FRACTION))
    limit = _max_positions(module)
    if limit is None or length + grow <= limit:
        return f"a copy {grow} columns longer", {k: _grow(k, v, batch, length, grow) for k, v in kwargs.items()}
    cut = length - max(1, length // 4)
    if cut < 2:
        return None
    return f"a copy cut to {cut} columns", {
        k: (v[:, :cut] if _tokenwise(v, batch, length) else v) for k, v in kwargs.items()
    }


def _other_rows(what: str, batch: dict, first: dict):
    """``batch`` with one row fewer (or, from one row, two): a graph that holds the first batch's
    number of rows (an epoch's last batch is smaller) fails here too."""
    ids = first.get("input_ids", first.get("attention_mask"))
    rows = ids.shape[0]
    pick = torch.arange(rows - 1) if rows > 1 else torch.zeros(2, dtype=torch.long)

    def take(value):
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows:
            return value.index_select(0, pick.to(value.device))
        return value

    return f"{what}, with {len(pick)} rows", {k: take(v) for k, v in batch.items()}


def _tokenwise(value, batch: int, length: int) -> bool:
    return torch.is_tensor(value) and value.dim() >= 2 and tuple(value.shape[:2]) == (batch, length)


def _grow(name: str, value, batch: int, length: int, grow: int):
    """``value`` with ``grow`` more columns: copies of its first columns (real tokens with their
    labels), so the loss reads the new positions. Padding would not do: a causal or recurrent model
    whose graph computes the first batch's positions only (a loop unrolled by the trace) gives the
    same loss on added padding, and fails only on a shorter batch, mid-run."""
    if not _tokenwise(value, batch, length):
        return value
    if name == "position_ids":
        tail = value[:, -1:] + torch.arange(1, grow + 1, device=value.device, dtype=value.dtype)
        return torch.cat([value, tail], dim=1)
    columns = torch.arange(grow, device=value.device) % length
    return torch.cat([value, value.index_select(1, columns)], dim=1)


def _max_positions(module: nn.Module) -> int | None:
    config = next((c for c in (getattr(m, "config", None) for m in module.modules()) if c is not None), None)
    limits = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions", "max_seq_len")]
    limits = [x for x in limits if isinstance(x, int) and x > 0]
    return min(limits) if limits else None


# Float attributes (of modules and configs) whose name holds one of these are randomness in training:
# dropout rates, layer drop, NEFTune's noise_alpha, MoE router jitter.
_RANDOMNESS = ("dropout", "drop_prob", "_drop", "layerdrop", "noise", "jitter")


def _settings_owners(module: nn.Module) -> list:
    """``module``'s submodules and their configs (each once): where forward reads its settings."""
    configs = {id(c): c for c in (getattr(m, "config", None) for m in module.modules()) if c is not None}
    return [*module.modules(), *configs.values()]


def refuse_layer_drop(module: nn.Module) -> None:
    """Raise when ``module`` skips layers at random in training (LayerDrop: ``if rand < layerdrop:
    continue`` in Python, which transformers' M2M100, NLLB, Wav2Vec2... read from their config):
    ORT traces forward once, so its graph would keep or skip the same layers at every step."""
    active = sorted(
        {
            key
            for owner in _settings_owners(module)
            for key, value in vars(owner).items()
            if isinstance(value, float) and value > 0 and ("layerdrop" in key or "layer_drop" in key)
        }
    )
    if active:
        raise NotImplementedError(
            f"LayerDrop is on ({', '.join(active)} > 0): it skips layers at random in Python, and ORT traces forward "
            "once, so its graph would skip the same layers at every step. Set them to 0 in the model's config "
            "(e.g. model.config.encoder_layerdrop = 0.0 before building the model), or train with --use_ort false"
        )


@contextlib.contextmanager
def _dropout_off(module: nn.Module):
    """Every source of training randomness at 0 for the block: ``nn.Dropout`` modules, and float
    attributes named as in :data:`_RANDOMNESS` (read in forward) on modules and configs."""
    saved: list[tuple[object, str, object]] = []
    for owner in _settings_owners(module):
        if isinstance(owner, nn.modules.dropout._DropoutNd):
            saved.append((owner, "p", owner.p))
            owner.p = 0.0
        for key, value in list(vars(owner).items()):
            if isinstance(value, float) and value > 0 and any(word in key for word in _RANDOMNESS):
                saved.append((owner, key, value))
                setattr(owner, key, 0.0)
    try:
        yield
    finally:
        for owner, key, value in reversed(saved):
            setattr(owner, key, value)


@contextlib.contextmanager
def _state_kept(module: nn.Module, params):
    """Gradients, buffers and torch's RNG as they were before the pre-flight."""
    grads = [p.grad for p in params]
    buffers = buffer_values(module)
    devices = sorted({p.device.index or 0 for p in params if p.is_cuda})
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        restore_buffers(module, buffers)
