"""First-batch checks remembered across runs, in the export cache folder (``--ort_export_cache_dir``).

Before its first export ORTTrainer runs PyTorch forwards on the first batch's first rows to decide
what ORT exports: whether ModuleWithLoss's cross-entropy is the model's loss (``loss_choice``), and
whether a causal LM's logits are its head's projection (``chunked_head``). On an export-cache hit
those forwards are most of what the first step still pays in PyTorch.

Those two checks run only on transformers heads whose ``forward`` and loss are transformers' own (a
model anything else touches keeps its own loss; the one check it gets, that it returns a loss at
all, only turns a later failure into an early, clear one). So their outcome is fixed by the code,
the configuration, the module tree, the dtypes and autocast, the Trainer's loss settings and the
layout of the rows checked: all of these, with the versions, make the digest an outcome is recorded
under (a JSON file per check, hashed in the folder's manifest, ``trust``). A later run with the same
digest takes the recorded outcome and runs no forward; anything else, or a file that is not the one
recorded, runs the check. An outcome that raised is never recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from . import trust
from .export_cache import (
    config_changes,
    config_fields,
    config_json,
    precision_facts,
    set_config_fields,
    source_digest,
    subfolder,
    trusted_root,
    versions,
)

logger = logging.getLogger(__name__)

FOLDER = "first-batch-checks"


class CheckMemo:
    """Recorded outcomes of the first-batch checks on ``model``, in ``folder``."""

    def __init__(self, folder: Path, model):
        self.folder = folder
        self.model = model
        self._model_digest: str | None = None

    def recall(self, check: str, rows: dict, facts: dict, compute: Callable[[], dict]) -> dict:
        """The outcome of ``check`` on ``rows`` (the batch rows it runs on) given ``facts`` (the
        caller's settings that decide it): the recorded one, else ``compute()``'s, then recorded.

        The check's forward may set fields of the model's config, as a first forward does
        (``problem_type``, in transformers' classifiers); those are recorded with the outcome and
        set again when it is taken, so the run saves the config the Trainer would."""
        path = self.folder / f"{check}-{self._digest(check, rows, facts)}.json"
        recorded = _read(path)
        if recorded is not None:
            set_config_fields(self.model, recorded["config_changes"])
            logger.info("ort_hf: first-batch check %s: the outcome recorded in %s (no forward run).", check, path)
            return recorded["outcome"]
        before = config_fields(self.model)
        outcome = compute()
        self._record(path, {"outcome": outcome, "config_changes": config_changes(before, self.model)})
        return outcome

    def _digest(self, check: str, rows: dict, facts: dict) -> str:
        if self._model_digest is None:
            model = self.model
            described = {
                "versions": versions(),
                "source": source_digest(model),
                "checks": _checks_source(),
                "config": config_json(model),
                "module": repr(model),
                "training": model.training,
            }
            self._model_digest = _sha(described)
        layout = {k: [str(getattr(v, "dtype", type(v).__name__)), getattr(v, "ndim", None)] for k, v in rows.items()}
        return _sha(
            {
                "model": self._model_digest,
                "precision": precision_facts(self.model),
                "check": check,
                "rows": layout,
                "row_count": _row_count(rows),
                "facts": facts,
            }
        )[:20]

    def _record(self, path: Path, recorded: dict) -> None:
        try:
            import filelock

            with filelock.FileLock(str(self.folder / ".lock")):
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(recorded, sort_keys=True))
                os.replace(tmp, path)
                trust.record(path)
        except OSError as exc:
            logger.info(
                "ort_hf: could not record the first-batch check in %s (%s); it runs again next time.", path, exc
            )


def first_batch_memo(cache_dir: str | None, model, shared: bool = False) -> CheckMemo | None:
    """The memo in the export cache folder ``cache_dir`` (None without one, or when it cannot be
    used: the checks then run, as without the cache)."""
    if not cache_dir:
        return None
    try:
        folder = subfolder(trusted_root(cache_dir, shared) / FOLDER, shared)
    except OSError:
        return None
    return CheckMemo(folder, model)


def _read(path: Path) -> dict | None:
    """The record in ``path`` if it is the file recorded and reads as one, else None."""
    if not (path.exists() and trust.verified(path)):
        return None
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(recorded, dict) and isinstance(recorded.get("outcome"), dict)
    return recorded if ok and isinstance(recorded.get("config_changes"), dict) else None


def _checks_source() -> str:
    """The checks' own code (``ort_hf.module_with_loss``): a changed check decides anew."""
    import ort_hf.module_with_loss as checks

    digest = hashlib.sha256()
    for path in sorted(Path(checks.__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _row_count(rows: dict) -> int | None:
    for value in rows.values():
        if getattr(value, "ndim", 0):
            return int(value.shape[0])
    return None


def _sha(described: dict) -> str:
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()
