"""Only what this user built is loaded: private cache folders and hashes checked before loading
(ort_hf/engine/trust.py)."""

import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_export_cache import _graphs, _run

from ort_hf.engine import extensions, trust

PACKAGE = Path(__file__).resolve().parents[2] / "ort_hf"


def test_private_folder_is_trusted_and_open_ones_are_not(tmp_path):
    private = trust.private_dir(tmp_path / "a" / "cache")
    assert oct(private.stat().st_mode & 0o777) == "0o700" and trust.untrusted_reason(private) is None
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert "mode 777" in trust.untrusted_reason(open_dir)
    group_parent = tmp_path / "team"
    (group_parent / "cache").mkdir(parents=True)
    group_parent.chmod(0o775)
    assert str(group_parent) in trust.untrusted_reason(group_parent / "cache")  # a parent others can write
    # A cache shared with the group on purpose: group write below its root is accepted, world write is not.
    assert trust.untrusted_reason(group_parent / "cache", shared_below=group_parent) is None
    group_parent.chmod(0o777)
    assert trust.untrusted_reason(group_parent / "cache", shared_below=group_parent) is not None


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root (os.chown)")
def test_folder_owned_by_another_user_is_not_trusted(tmp_path):
    other = tmp_path / "theirs"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    assert "owned by uid 12345" in trust.untrusted_reason(other)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root (os.chown)")
def test_cache_reached_through_a_link_is_judged_where_it_really_lives(tmp_path):
    """Our private cache folder inside a folder another uid owns (who can rename and replace it),
    reached through a link in a folder of ours: refused, naming the real parent."""
    theirs = tmp_path / "theirs"
    cache = trust.private_dir(theirs / "cache")
    os.chown(theirs, 12345, 12345)
    home = trust.private_dir(tmp_path / "home")
    (home / "cache").symlink_to(cache)
    assert trust.untrusted_reason(cache) is not None
    assert f"{theirs} is owned by uid 12345" in trust.untrusted_reason(home / "cache")
    assert f"{theirs} is owned by uid 12345" in trust.untrusted_reason(home / "cache" / "extensions")


def test_links_are_judged_by_their_own_folder_and_their_target(tmp_path):
    private = trust.private_dir(tmp_path / "private" / "cache")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    # A link in a folder anyone can write (anyone could point it elsewhere), to a private target.
    (open_dir / "cache").symlink_to(private)
    assert "mode 777" in trust.untrusted_reason(open_dir / "cache")
    # A link in a private folder to a target below a folder anyone can write; relative, and a chain.
    trust.private_dir(open_dir / "target")
    home = trust.private_dir(tmp_path / "home")
    (home / "hop").symlink_to(Path("..") / "open")
    (home / "cache").symlink_to(home / "hop" / "target")
    assert f"{open_dir} is owned by uid {os.getuid()} with mode 777" in trust.untrusted_reason(home / "cache")
    # A link between private folders is fine.
    (home / "ok").symlink_to(private)
    assert trust.untrusted_reason(home / "ok") is None
    assert trust.folders_on_the_way(home / "ok")[-1] == private


def test_world_writable_extension_cache_is_replaced_by_a_private_folder(tmp_path, monkeypatch, caplog):
    planted = tmp_path / "shared"
    planted.mkdir()
    planted.chmod(0o777)
    monkeypatch.setenv(extensions.CACHE_ENV, str(planted))
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        chosen = extensions.extension_dir()
    assert planted not in chosen.parents and trust.untrusted_reason(chosen) is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert str(planted) in said and "chmod 700" in said and "mode 777" in said


def test_tampered_extension_is_rebuilt_not_loaded(tmp_path):
    """A byte changed in a built .so: the next process does not load it, rebuilds it, and the new
    one matches its recorded hash."""
    source = extensions.extension_dir()
    cache = tmp_path / "cache"
    copy = cache / "extensions" / source.name / "aten_op_executor"
    shutil.copytree(source / "aten_op_executor", copy)
    builds = [so for so in copy.glob("build-*/aten_op_executor.so") if trust.verified(so)]
    assert builds  # today's, and any older build a long-lived cache still holds
    for built in builds:
        data = bytearray(built.read_bytes())
        data[len(data) // 2] ^= 0xFF
        built.write_bytes(bytes(data))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ort_hf.engine.extensions import build_extension; build_extension('aten_op_executor')",
        ],
        env={**os.environ, extensions.CACHE_ENV: str(cache)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "does not match the hash" in proc.stderr and "building ORTModule extension" in proc.stderr
    (rebuilt,) = [so for so in copy.glob("build-*/aten_op_executor.so") if trust.verified(so)]
    assert rebuilt in builds


def test_tampered_cached_graph_is_exported_again(tmp_path):
    first = _run(tmp_path)
    (graph,) = _graphs(tmp_path)
    data = bytearray(graph.read_bytes())
    data[-20] ^= 0x01  # one bit of a weight or attribute: still a loadable graph, a different one
    graph.write_bytes(bytes(data))
    second = _run(tmp_path)
    assert second["export_count"] == 1  # not loaded: exported again
    assert second["losses"] == pytest.approx(first["losses"], abs=1e-6)
    assert trust.verified(graph)


def test_manifest_survives_kill_during_writes(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"x" * 4096)
    writer = (
        "import sys; from pathlib import Path; from ort_hf.engine import trust\n"
        "p = Path(sys.argv[1])\n"
        "for i in range(100000):\n"
        "    (p.parent / f'f{i % 50}').write_bytes(bytes([i % 256]) * 1024); trust.record(p.parent / f'f{i % 50}')\n"
    )
    rng = random.Random(0)
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", writer, str(target)])
        time.sleep(1.0 + rng.random())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        entries = json.loads((tmp_path / trust.MANIFEST).read_text())  # never half a file
        assert isinstance(entries, dict) and entries
        # Every recorded file matches, but the one being rewritten when the kill came.
        stale = [name for name in entries if not trust.verified(tmp_path / name)]
        assert len(stale) <= 1, stale


def test_nothing_is_unpickled():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bpickle\b", line) or ("torch.load(" in line and "weights_only=True" not in line):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not offenders, offenders
