"""Checks that turn bad input into a clear message before ORT runs, and checkpoint completeness."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path

import torch

from .._paths import probe_writable

logger = logging.getLogger(__name__)

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def host_check_due(device_type: str, global_step: int, logging_steps: int) -> bool:
    """Whether a check that reads a value on the host (a token id range, a loss's finiteness) runs at
    this step. On CPU always (nothing runs ahead of the host); on an accelerator, where reading
    a value stalls the queue of kernels the Trainer keeps free of syncs until it logs, on the
    first step and at logging steps only."""
    if device_type == "cpu":
        return True
    return global_step == 0 or (logging_steps > 0 and (global_step + 1) % logging_steps == 0)


def check_token_ids(inputs: dict, vocab_size: int | None) -> None:
    """Raise if ``input_ids`` fall outside the embedding table (ORT would abort in C++)."""
    ids = inputs.get("input_ids")
    if vocab_size is None or not torch.is_tensor(ids) or ids.numel() == 0 or ids.is_floating_point():
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = high if high >= vocab_size else low
        raise ValueError(
            f"Token id {bad} is outside the model's vocabulary (vocab_size={vocab_size}): the tokenizer "
            "does not match the model. Use the model's own tokenizer, or call "
            "model.resize_token_embeddings(len(tokenizer)) after adding tokens."
        )


def warn_if_not_finite(loss: torch.Tensor, labels, step: int) -> None:
    """Warn of a NaN or infinite loss at ``step``, with the likely cause when every label is ignored."""
    if torch.isfinite(loss.detach()).all():
        return
    why = ""
    if isinstance(labels, torch.Tensor) and not labels.is_floating_point() and bool((labels == -100).all()):
        why = (
            " Every label of this batch is -100 (ignored): a mean over no labelled token is NaN, in "
            "PyTorch as in ORT; drop such rows (e.g. truncation that cut every answer token) or check "
            "the collator's label masking."
        )
    logger.warning(
        "ort_hf: non-finite loss %s at step %d (the logged loss filters it when "
        "logging_nan_inf_filter is on, as the Trainer does).%s",
        loss.item(),
        step,
        why,
    )


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be resumed from, or None when it is intact.

    The Trainer writes trainer_state.json last, so a save that was interrupted has no readable
    state file. Files damaged afterwards (truncated, or overwritten where their structure is) are
    found from headers and sizes only, never by reading the tensors (tens of GB of optimizer state
    on a large model): every safetensors header against the file size, and in the zip archives
    torch.save writes (optimizer, scheduler, RNG states, training args) the central directory and
    each member's local header and extent. Bytes changed inside a tensor's data are not looked for.
    """
    path = Path(path)
    try:
        with open(path / TRAINER_STATE) as f:
            json.load(f)
    except (OSError, ValueError):
        return f"{TRAINER_STATE} is missing or unreadable (the save was interrupted)"
    for file in sorted(path.iterdir()):
        problem = _file_problem(file)
        if problem:
            return f"{file.name} is damaged ({problem})"
    return None


def _file_problem(file: Path) -> str | None:
    try:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), "pt") as f:  # parses the header, checks it against the file size
                f.keys()
        elif file.suffix in (".pt", ".pth", ".bin") and file.stat().st_size:
            if not zipfile.is_zipfile(file):
                return "not a torch.save archive: truncated or overwritten"
            return _zip_structure_problem(file)
        elif file.suffix == ".json":
            with open(file) as f:
                json.load(f)
    except Exception as exc:  # safetensors raises its own error type
        return f"{type(exc).__name__}: {exc}"
    return None


def _zip_structure_problem(file: Path) -> str | None:
    """A member of a zip archive whose local header is not where the central directory says, or
    whose data would run past the end of the file; None when every member is in place."""
    size = file.stat().st_size
    with zipfile.ZipFile(file) as archive, open(file, "rb") as raw:
        for info in archive.infolist():
            raw.seek(info.header_offset)
            header = raw.read(30)
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                return f"the header of {info.filename} is overwritten"
            name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
            if info.header_offset + 30 + name_len + extra_len + info.compress_size > size:
                return f"{info.filename} runs past the end of the file: truncated"
    return None


def is_complete_checkpoint(path: str | Path) -> bool:
    return checkpoint_problem(path) is None


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` in ``output_dir`` that is intact (completely written, not
    damaged since), or None."""
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        ((int(m.group(1)), name) for name in os.listdir(output_dir) if (m := _CHECKPOINT_RE.match(name))),
        reverse=True,
    )
    for _, name in steps:
        path = os.path.join(output_dir, name)
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        logger.warning("ort_hf: skipping %s: %s.", path, problem)
    return None


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only, ...); earlier ones are intact."""


@contextlib.contextmanager
def unfinished_checkpoint_guard(output_dir: str, current_step, writes_checkpoints: bool):
    """Around ``Trainer.train``: when training stops on an error and ``checkpoint-<current step>``
    is there but incomplete, the error came from writing it (full or read-only disk). The process
    that writes checkpoints (``writes_checkpoints``: ``args.should_save``) removes it, and only if
    this run created it (never complete, and on a full disk its bytes are what the user needs
    back); the error is re-raised as one message naming the intact checkpoint. Other ranks, folders
    that were there before the run and complete checkpoints are never touched; any other error
    passes through unchanged."""
    before = set(os.listdir(output_dir)) if os.path.isdir(output_dir) else set()
    try:
        yield
    except Exception as exc:  # torch.save and safetensors report a full disk as RuntimeError / SafetensorError
        folder = Path(output_dir) / f"checkpoint-{current_step()}"
        if not writes_checkpoints or folder.name in before or not folder.is_dir() or is_complete_checkpoint(folder):
            raise
        try:
            free_mb = shutil.disk_usage(output_dir).free / 2**20
            space = "the disk is full" if free_mb < 1 else f"{free_mb:,.0f} MB were free on that disk"
        except OSError:
            space = "free space unknown"
        shutil.rmtree(folder, ignore_errors=True)
        last = last_complete_checkpoint(output_dir)
        raise CheckpointWriteError(
            f"Writing {folder.name} in {output_dir} failed ({type(exc).__name__}: {exc}; {space}). "
            f"The unfinished checkpoint was removed; the last complete one, {last or 'none yet'}, is intact. "
            "Free disk space (or change --output_dir / --save_total_limit), then rerun with "
            "resume_from_checkpoint=True to continue from it."
        ) from exc


def check_output_dir_writable(output_dir: str) -> None:
    """Fail before training when checkpoints could not be written (read-only or unusable folder)."""
    try:
        probe_writable(output_dir)
    except OSError as exc:
        raise ValueError(
            f"--output_dir {output_dir} is not writable ({exc.strerror or exc}): no checkpoint could be saved. "
            "Choose a writable folder (or --save_strategy no if you want none)."
        ) from exc


def check_train_dataset(dataset) -> None:
    if dataset is None:
        return
    try:
        size = len(dataset)
    except TypeError:
        return  # iterable dataset: size unknown
    if size == 0:
        raise ValueError("The train dataset is empty: check the data files and any max_train_samples / filters.")
