"""Whether the libraries ort_hf is written against are in the ranges it is tested with.

The ranges are declared once, in pyproject.toml (its floors and caps: the versions the suite
passes on, ``make test-latest`` tries the newest), and read back here from the installed
package's metadata. ort_hf overrides Trainer hooks, ports ORT's C++ extensions to torch's
headers and reads TRL's head settings: outside those ranges a failure would surface far from
its cause, so the first use names the untested version and the pin instead.
"""

from __future__ import annotations

import functools
import logging
from importlib import metadata

logger = logging.getLogger(__name__)

# What ort_hf's code is written against (the rest of its requirements are plain floors).
WRITTEN_AGAINST = ("torch", "transformers", "accelerate", "peft", "trl")


def tested_ranges(requirements: list[str] | None = None) -> dict[str, str]:
    """Package name -> the version range ort_hf declares for it (extras' ranges included)."""
    from packaging.requirements import Requirement

    if requirements is None:
        requirements = metadata.requires("ort_hf") or []
    ranges: dict[str, str] = {}
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name in WRITTEN_AGAINST and str(requirement.specifier):
            ranges[requirement.name] = str(requirement.specifier)
    return ranges


def untested(installed: dict[str, str] | None = None, requirements: list[str] | None = None) -> list[str]:
    """One line per installed library outside its tested range: what is installed and what to pin."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    lines = []
    for name, spec in tested_ranges(requirements).items():
        version = installed.get(name) if installed is not None else _installed(name)
        if version is None:
            continue
        release = Version(Version(version).base_version)  # 2.13.0+cpu is 2.13.0
        if not SpecifierSet(spec).contains(release, prereleases=True):
            lines.append(f"{name} {version} is outside the tested range {spec}: pip install '{name}{spec}'")
    return lines


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def warn_untested() -> list[str]:
    """Log once per process which libraries are outside their tested range (first use)."""
    lines = untested()
    if lines:
        logger.warning(
            "ort_hf: untested library versions; ORTTrainer and the engine may fail far from the cause "
            "(Trainer hooks, C++ extension ports, TRL's head). Pin the tested ones, or run `make "
            "test-latest` to try these:\n  %s",
            "\n  ".join(lines),
        )
    return lines
