"""Which CPU a result came from: the same tree gives very different ratios on different CPU kinds
(an Intel Xeon with AVX512 against an AMD EPYC with AVX2), so every result names its CPU and results
are kept per CPU kind, side by side. A VM may report only "AMD EPYC" as the model name, for
generations as far apart as an AVX512 EPYC of /proc/cpuinfo family 25 and one of family 26 (ORT's
MLM step 1369 ms on the first, 863 on the second, eager's 2961 and 2544: docs/results/bench/), so a
kind is also told by its CPU family. Records
written before the family was recorded keep the key they were stored under. No torch at import: the
renderer reads stored records."""

from __future__ import annotations

import os
import platform
import re

from .._cpuinfo import cpu_family, cpuinfo_field

# The words of /proc/cpuinfo's model name that do not tell one CPU kind from another.
_NOISE = re.compile(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$|\b\d+-core\b", re.IGNORECASE)
# How `ort-hf bench` named the CPU before it wrote a record: "2 CPUs (AMD EPYC; PyTorch's CPU kernels: AVX2), ...".
_MACHINE = re.compile(r"^(\d+) CPUs \((.*); PyTorch's CPU kernels: (\w+)\)")


def model_name() -> str:
    """The CPU's model name as the kernel reports it (``lscpu``'s "Model name")."""
    return cpuinfo_field("model name") or platform.processor() or "unknown CPU"


def cpu_record() -> dict:
    """This machine's CPU: model name, the instruction set PyTorch's CPU kernels dispatch to, cores."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return make_record(model_name(), capability, os.cpu_count() or 1, cpu_family())


def make_record(model: str, capability: str, cores: int, family: int | None = None) -> dict:
    record = {"model": model, "capability": capability, "cores": cores}
    if family is not None:
        record["family"] = family
    return {**record, "key": cpu_key(model, capability, cores, family)}


def cpu_key(model: str, capability: str, cores: int, family: int | None = None) -> str:
    """A folder name per CPU kind, e.g. ``amd-epyc-avx512-family25-2cpu``: results of one kind
    replace only their own."""
    words = re.findall(r"[a-z0-9]+", _NOISE.sub(" ", model).lower()) or ["cpu"]
    kind = [capability.lower()] if family is None else [capability.lower(), f"family{family}"]
    return "-".join([*words, *kind, f"{cores}cpu"])


def describe(record: dict) -> str:
    """One line for a table or a heading: "AMD EPYC (family 25), AVX512, 2 cores" ("Intel(R) Xeon(R)
    Processor @ 2.50GHz" reads "Intel Xeon"; a record without a family, "AMD EPYC, AVX2, 2 cores")."""
    model = " ".join(_NOISE.sub(" ", record["model"]).split()) or record["model"]
    if "family" in record:
        model = f"{model} (family {record['family']})"
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
