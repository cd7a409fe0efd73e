"""What the engine knows of one wrapped model while ORT exports and runs it.

ORT's hooks receive no per-model options of their own: the wrapped model whose forward is running
sets :data:`ACTIVE_EXPORT_RECORD`, and the hooks (``model_hooks.py``) and bridges (``compat.py``)
read its settings from there.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from .swap_switches import wanted_swaps


@dataclass
class ExportRecord:
    """Per wrapped model: what the bridges saw during its ORT exports."""

    enable_label_sparsity: bool = True
    enable_mem_reuse: bool = False
    intra_op_threads: int | None = None  # None: ORT's default pool size
    intra_op_spinning: bool = True
    torch_threads: int | None = None  # PyTorch's threads while ORT runs (None: unchanged)
    export_cache_shared: bool = False  # ORTOptions.export_cache_shared
    profile_dir: str | None = None  # ORTOptions.profile_dir
    device_type: str = "cpu"  # where the model trains (placement.py): the graph's device
    kernel_swaps: frozenset[str] = frozenset()  # cpu_kernel_swaps' swaps wanted in its training graph
    weight_grad_min_dim: int = 0  # ORTOptions.cpu_weight_grad_min_dim
    linear_product_min_dim: int = 0  # ORTOptions.cpu_linear_product_min_dim
    swapped: dict[str, int] | None = None  # what cpu_kernel_swaps changed in the training graph built last
    export_count: int = 0
    export_seconds: float = 0.0
    eliminate_padding: bool = False  # set per training forward: rewrite the graph if one is built now
    padding_rewrite: object | None = None  # padding_elimination.Rewrite of the graph built last
    export_cache_entry: object | None = None  # the export cache entry (a Path) of the export run last
    runtime_inspector: object | None = None  # ORT's RuntimeInspector of the export running (feeds ORT's banner)

    def configure(self, options, device_type: str) -> None:
        """Take the per-model settings from ``options`` (an ``ORTOptions``), each option's default
        resolved for the model's device type (``"cpu"`` or ``"cuda"``); the export counters are kept."""
        on_cuda = device_type == "cuda"
        self.device_type = device_type
        self.kernel_swaps = wanted_swaps(options, device_type)
        self.weight_grad_min_dim = options.cpu_weight_grad_min_dim
        self.linear_product_min_dim = options.cpu_linear_product_min_dim
        self.enable_label_sparsity = options.enable_label_sparsity
        self.enable_mem_reuse = options.mem_reuse_on
        self.intra_op_threads = options.intra_op_threads
        self.intra_op_spinning = options.intra_op_spinning if options.intra_op_spinning is not None else on_cuda
        torch_threads = options.torch_threads_in_graph
        if torch_threads is None:
            torch_threads = 0 if on_cuda else 1
        self.torch_threads = torch_threads or None
        self.export_cache_shared = options.export_cache_shared
        self.profile_dir = options.profile_dir


# The wrapped model whose forward is running.
ACTIVE_EXPORT_RECORD: contextvars.ContextVar[ExportRecord | None] = contextvars.ContextVar(
    "ort_hf_active_export_record", default=None
)
