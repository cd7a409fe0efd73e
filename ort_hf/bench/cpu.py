"""Which CPU a result came from: the same tree gives very different ratios on different CPU kinds
(an Intel Xeon with AVX512 against an AMD EPYC with AVX2), so every result names its CPU and results
are kept per CPU kind, side by side. No torch at import: the renderer reads stored records."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

# The words of /proc/cpuinfo's model name that do not tell one CPU kind from another.
_NOISE = re.compile(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$|\b\d+-core\b", re.IGNORECASE)
# How `ort-hf bench` named the CPU before it wrote a record: "2 CPUs (AMD EPYC; PyTorch's CPU kernels: AVX2), ...".
_MACHINE = re.compile(r"^(\d+) CPUs \((.*); PyTorch's CPU kernels: (\w+)\)")


def model_name() -> str:
    """The CPU's model name as the kernel reports it (``lscpu``'s "Model name")."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_record() -> dict:
    """This machine's CPU: model name, the instruction set PyTorch's CPU kernels dispatch to, cores."""
    import torch

    return make_record(model_name(), torch.backends.cpu.get_cpu_capability(), os.cpu_count() or 1)


def make_record(model: str, capability: str, cores: int) -> dict:
    return {"model": model, "capability": capability, "cores": cores, "key": cpu_key(model, capability, cores)}


def cpu_key(model: str, capability: str, cores: int) -> str:
    """A folder name per CPU kind, e.g. ``amd-epyc-avx2-2cpu``: results of one kind replace only their own."""
    words = re.findall(r"[a-z0-9]+", _NOISE.sub(" ", model).lower()) or ["cpu"]
    return "-".join([*words, capability.lower(), f"{cores}cpu"])


def describe(record: dict) -> str:
    """One line for a table or a heading: "AMD EPYC, AVX2, 2 cores" ("Intel(R) Xeon(R) Processor @
    2.50GHz" reads "Intel Xeon")."""
    model = " ".join(_NOISE.sub(" ", record["model"]).split()) or record["model"]
    return f"{model}, {record['capability']}, {record['cores']} cores"


def record_of(conditions: dict) -> dict | None:
    """The CPU record of a result's conditions; results written before the record existed named the
    CPU in their ``machine`` line, which is read instead."""
    if "cpu" in conditions:
        return conditions["cpu"]
    match = _MACHINE.match(conditions.get("machine", ""))
    if not match:
        return None
    cores, model, capability = match.groups()
    return make_record(model, capability, int(cores))
