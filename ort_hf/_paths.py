"""Filesystem checks shared by the trainer (output_dir) and the engine (extension cache)."""

from __future__ import annotations

import os
from pathlib import Path


def probe_writable(folder: str | os.PathLike) -> None:
    """Create ``folder`` if needed and write, then remove, a small file in it.

    Raises the ``OSError`` that a real write would hit (read-only, permissions, a file in the
    way), so callers can fail or fall back before any long work starts."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".ort_hf-write-probe-{os.getpid()}"
    probe.write_bytes(b"ok")
    probe.unlink()
