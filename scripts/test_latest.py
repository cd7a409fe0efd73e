"""`make test-latest`: the suite on the newest releases the registry serves of what ort_hf is
written against (``_versions.WRITTEN_AGAINST``), in the venv it runs in (.venv-latest).

Installs ort_hf without its dependencies, then its cpu and dev requirements as pyproject.toml
declares them, except that those libraries get no cap (the newest wins); prints each one's
version against the tested range, and runs the tests (its arguments, if any, are pytest's instead
of ``tests``). Outside CI: torch's default build is
multi-GB. A pass is the evidence for raising a cap in pyproject.toml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ort_hf's editable install is read at interpreter start, after this one's
ENV = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"} | {"PIP_CONFIG_FILE": os.devnull}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True, env=ENV, cwd=ROOT)


def requirements() -> list[str]:
    """ort_hf's cpu and dev requirements, extras resolved, the capped libraries uncapped."""
    from importlib import metadata

    from packaging.requirements import Requirement

    from ort_hf._versions import WRITTEN_AGAINST

    wanted, extras = [], {"cpu", "dev", "bench", "examples", "deepspeed", "peft", "trl"}
    for line in metadata.requires("ort_hf") or []:
        req = Requirement(line)
        if req.name == "ort_hf" or (req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras)):
            continue
        wanted.append(req.name if req.name in WRITTEN_AGAINST else f"{req.name}{req.specifier}")
    return wanted


def main() -> int:
    pip("--upgrade", "pip", "packaging")
    pip("--no-deps", "-e", str(ROOT))
    pip("--upgrade", *requirements())
    from importlib import metadata

    from ort_hf._versions import tested_ranges, untested

    print("test-latest: versions installed (tested ranges from pyproject.toml):")
    for name, spec in tested_ranges().items():
        print(f"  {name:<13} {metadata.version(name):<12} tested {spec}")
    print("  outside the tested ranges:", "; ".join(untested()) or "none")
    return subprocess.run([sys.executable, "-m", "pytest", *(sys.argv[1:] or ["tests"])], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
