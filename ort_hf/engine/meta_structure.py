"""ORT's output-structure pass on the meta device, checked against the trace that follows it.

Before tracing, ORT 1.19.2 runs the model once in PyTorch only to learn the structure of its
outputs (``_io.parse_outputs_for_onnx_export_and_extract_schema``): how many tensors, their dtypes
and ranks, and the containers around them (the output schema). It needs them before the trace, for
the output names and dynamic axes it passes to ``torch.onnx.export``. ``model_hooks`` cut that pass
to two rows; on the bench's 485M LoRA model those two rows still cost about a third of a forward.

Here the pass runs on a copy of the model whose parameters and buffers are on the meta device
(shapes and dtypes, no data, no arithmetic), with meta inputs. A forward whose Python reads a
tensor's values (``.item()``, ``if mask.any()``) cannot run there and raises: the two-row pass
runs as before. A forward that does run there could still take a branch on the device; so the
schema it gives is only kept when the trace agrees: ORT's ``_FlattenedModule`` records the schema
of the outputs it returns on every forward, the trace's included (on the real batch), and
:func:`checked_by_trace` compares the two, type for type. If they differ, or no trace ran (ORT's
cache loaded the graph), the export is redone with ORT's pass in PyTorch, as before. The graph is
the one the PyTorch pass gives: the same output names and dynamic axes, from the same schema.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import os

import torch

logger = logging.getLogger(__name__)

# While ORT's export runs under checked_by_trace: a list (the structure pass may run on meta
# tensors), to which a pass that did appends True.
_META_ALLOWED: contextvars.ContextVar[list | None] = contextvars.ContextVar("ort_hf_meta_structure", default=None)


def allowed() -> bool:
    return _META_ALLOWED.get() is not None


def mark_used() -> None:
    _META_ALLOWED.get().append(True)


def meta_pass(original, module: torch.nn.Module, inputs, logger_):
    """ORT's pass (``original``) on a meta copy of ``module`` and meta copies of ``inputs``; raises
    whatever the forward raises there."""
    memo: dict[int, object] = {}
    for value in (*module.parameters(), *module.buffers()):
        meta = value.detach().to("meta")
        memo[id(value)] = (
            torch.nn.Parameter(meta, value.requires_grad) if isinstance(value, torch.nn.Parameter) else meta
        )
    shadow = copy.deepcopy(module, memo)  # a tensor kept outside parameters and buffers stays real: mixing raises
    # 0-dim inputs stay real: ORT passes the forward's Python constants (use_cache=True) as 0-dim
    # tensors, which the forward reads as values; a CPU scalar mixes with meta tensors.
    meta_inputs = [t.detach().to("meta") if isinstance(t, torch.Tensor) and t.dim() else t for t in inputs]
    with torch.device("meta"):
        return original(shadow, meta_inputs, logger_, False)


def checked_by_trace(get_exported_model):
    """ORT's ``_get_exported_model`` with the structure pass allowed on meta tensors, its schema
    kept only when the trace's equals it (see the module docstring)."""
    from . import output_schema

    def checked(**kwargs):
        module = kwargs["flattened_module"]
        module._output_schema = None  # set again by the trace's forward
        used: list = []
        token = _META_ALLOWED.set(used)
        try:
            model, schema = get_exported_model(**kwargs)
        except Exception as exc:
            if not used:
                raise
            # the trace's outputs did not fit the names the meta pass gave (another count)
            logger.info("ort_hf: the export after the shapes-only output-structure pass failed (%s).", exc)
            model = schema = None
        finally:
            _META_ALLOWED.reset(token)
        traced = module._output_schema
        if not used or (traced is not None and output_schema.same(traced, schema)):
            return model, schema
        if traced is not None:  # the trace saw another structure: that export's graph is not kept
            logger.info("ort_hf: the trace did not confirm the shapes-only output-structure pass; exporting again.")
            _drop_ort_cache_file(kwargs)
        return get_exported_model(**kwargs)  # ORT's pass in PyTorch (no trace ran: ORT's cache loaded the graph)

    return checked


def _drop_ort_cache_file(kwargs: dict) -> None:
    """ORT saved the graph of the unconfirmed export into its cache folder: not to be loaded."""
    folder = kwargs.get("ortmodule_cache_dir")
    if not folder:
        return
    from .export_cache import _ort_file_name

    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, _ort_file_name(kwargs["flattened_module"])))
