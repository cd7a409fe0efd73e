"""`ort-hf env`: one block to paste into a bug report (versions against the tested ranges, ORT's
build, where the extensions and caches are). Reads only: nothing is built, exported or run."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

DISTRIBUTIONS = (
    "ort_hf",
    "torch",
    "transformers",
    "accelerate",
    "peft",
    "trl",
    "deepspeed",
    "datasets",
    "onnx",
    "onnxruntime-training-cpu",
    "onnxruntime-training",
    "numpy",
)


def env_lines() -> list[tuple[str, str]]:
    from ._versions import tested_ranges
    from .engine import CACHE_ENV, cache_root, driver_present, provider_library

    ranges = tested_ranges()
    lines = [("python", f"{platform.python_version()} ({sys.executable})"), ("platform", platform.platform())]
    for dist in DISTRIBUTIONS:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "not installed"
        lines.append((dist, version + (f" (tested: {ranges[dist]})" if dist in ranges else "")))
    provider = provider_library()
    lines.append(("ORT build", f"CUDA ({provider})" if provider else "CPU"))
    lines.append(("NVIDIA driver", "present" if driver_present() else "none"))
    lines.append(("extension cache", str(cache_root()) + (f" (${CACHE_ENV})" if os.environ.get(CACHE_ENV) else "")))
    builds = cache_root() / "extensions"
    for build in sorted(builds.iterdir()) if builds.is_dir() else []:
        lines.append((f"  {build.name}", ", ".join(sorted(p.name for p in build.iterdir() if p.is_dir())) or "empty"))
    lines += [
        (name, value)
        for name, value in sorted(os.environ.items())
        if name.startswith(("ORTMODULE_", "ORT_HF_", "CUDA_MODULE_LOADING", "CUDA_CACHE_"))
    ]
    return lines


def print_env() -> int:
    lines = env_lines()
    width = max(len(name) for name, _ in lines)
    print("ort-hf env")
    for name, value in lines:
        print(f"  {name.ljust(width)}  {value}")
    return 0
