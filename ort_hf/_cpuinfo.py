"""One field of /proc/cpuinfo, for the CPU-decided engine defaults and for naming a benchmark's CPU.
No torch at import."""

from __future__ import annotations

from pathlib import Path


def cpuinfo_field(field: str) -> str | None:
    """The first value of /proc/cpuinfo's ``field`` (``vendor_id``, ``model name``, ``cpu family``),
    None where there is no such file or field."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip() == field:
            return value.strip()
    return None


def cpu_family() -> int | None:
    """/proc/cpuinfo's ``cpu family`` (AMD's 25 and 26 are different generations; Intel's is 6)."""
    family = cpuinfo_field("cpu family")
    return int(family) if family and family.isdigit() else None
