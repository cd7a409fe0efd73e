"""What the engine loads from disk is what this user built: owned directories and checked hashes.

The engine loads compiled extensions (``.so``: code run in this process) from its extension cache
and exported training graphs (``.onnx``: what the model computes) from the export cache. Anyone
who can write to those directories could plant either. So, as ssh does with key directories:

- Cache directories are created with mode 0700. Before anything is loaded, every directory from
  ``/`` down to the cache folder (through symbolic links: the folders holding each link and every
  folder the path really leads to) must be owned by this user or root and not writable by group or
  others (a root-owned sticky directory such as ``/tmp`` is fine: others cannot rename entries in
  it). A folder that fails is not used: the engine says why and what to do, and builds or exports
  into a fresh private directory instead. An export cache shared with a group on purpose
  (``ORTOptions.export_cache_shared``) may be group-owned and group-writable below its root.
- Every file written there is recorded with its sha256 in a ``manifest.json`` beside it, written
  atomically under the caller's lock. A file whose hash does not match (or that no manifest
  records) is not loaded: it is rebuilt or re-exported, with one warning naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def folders_on_the_way(folder: Path) -> list[Path]:
    """Every directory the kernel walks through to reach ``folder``: each link is followed as
    ``realpath`` follows it, so the list holds the folders that hold the links (whoever can
    write there can swap the link) and the folders the path really leads to, parents included."""
    current, seen, hops = Path("/"), [Path("/")], 0
    pending = list(Path(os.path.abspath(folder)).parts[1:])
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        candidate = current / name
        if candidate.is_symlink():
            hops += 1
            if hops > 40:  # the kernel's own limit (ELOOP)
                raise OSError(f"too many symbolic links on the way to {folder}")
            target = Path(os.readlink(candidate))
            if target.is_absolute():
                current = Path("/")
            pending = [part for part in target.parts if part != "/"] + pending
            continue
        current = candidate
        if current not in seen:
            seen.append(current)
    return seen


def untrusted_reason(folder: Path, shared_below: Path | None = None) -> str | None:
    """Why ``folder`` must not be trusted, or None. Every directory on the way to it is judged,
    through links (:func:`folders_on_the_way`). ``shared_below``: a root under which group
    ownership and group write are accepted (a deliberately shared cache)."""
    uid = os.getuid()
    if shared_below is not None:
        shared_below = Path(os.path.realpath(shared_below))
    try:
        directories = folders_on_the_way(folder)
    except OSError as exc:
        return str(exc)
    for directory in directories:
        try:
            info = directory.stat()
        except OSError:
            break  # missing: created by us, mode 0700, below a checked parent (or not at all: the caller says so)
        mode = stat.S_IMODE(info.st_mode)
        shared = shared_below is not None and (directory == shared_below or shared_below in directory.parents)
        owner_ok = info.st_uid in (uid, 0) or shared
        writable_by_others = mode & (stat.S_IWOTH if shared else stat.S_IWGRP | stat.S_IWOTH)
        sticky_root_dir = info.st_uid == 0 and mode & stat.S_ISVTX
        if not owner_ok or (writable_by_others and not sticky_root_dir):
            return (
                f"{directory} is owned by uid {info.st_uid} with mode {mode:o}: only its owner (uid {uid}) or "
                f"root may own it, and no one else may write to it"
            )
    return None


def private_dir(folder: Path) -> Path:
    """``folder`` created with mode 0700 (parents too, where they are missing)."""
    folder = Path(folder)
    missing = [p for p in [*reversed(folder.parents), folder] if not p.exists()]
    for directory in missing:
        directory.mkdir(mode=0o700, exist_ok=True)
    return folder


_replacements: dict[tuple[Path, Path | None], Path] = {}


def trusted_dir(folder: Path, what: str, remedy: str, shared_below: Path | None = None) -> Path:
    """``folder`` if it passes :func:`untrusted_reason` (created private if missing), else a
    private temporary directory, after one warning saying why and what to do; one such
    directory and one warning per folder and process, however often a caller asks."""
    key = (Path(os.path.abspath(folder)), shared_below)
    if key in _replacements:
        return _replacements[key]
    reason = untrusted_reason(folder, shared_below)
    if reason is None:
        try:
            return private_dir(folder)
        except OSError:
            return folder  # not creatable: the caller's own write check reports it
    fresh = _replacements[key] = Path(tempfile.mkdtemp(prefix="ort_hf-"))  # mode 0700, owned by this user
    logger.warning(
        "ort_hf: not using %s for %s: %s. Fix it with `chmod 700 %s` (or choose another %s); using "
        "the private directory %s for this run.",
        folder,
        what,
        reason,
        folder,
        remedy,
        fresh,
    )
    return fresh


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record(path: Path) -> None:
    """Add ``path``'s hash to the manifest beside it (call under the folder's lock)."""
    manifest = path.parent / MANIFEST
    entries = _read(manifest)
    entries[path.name] = sha256(path)
    _write(manifest, entries)


def verified(path: Path) -> bool:
    """Whether ``path`` is the file the manifest beside it recorded."""
    expected = _read(path.parent / MANIFEST).get(path.name)
    return expected is not None and path.exists() and sha256(path) == expected


def forget(path: Path) -> None:
    """Remove ``path`` and its manifest entry (call under the folder's lock)."""
    path.unlink(missing_ok=True)
    manifest = path.parent / MANIFEST
    entries = _read(manifest)
    if entries.pop(path.name, None) is not None:
        _write(manifest, entries)


def _write(manifest: Path, entries: dict) -> None:
    tmp = manifest.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(entries, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest)  # a reader sees the old manifest or the new one, never half of one


def _read(manifest: Path) -> dict:
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}  # missing or unreadable: nothing is trusted
    return data if isinstance(data, dict) else {}
