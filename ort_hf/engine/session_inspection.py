"""Read-only views of a wrapped model's ORT training session: its optimised graph, providers,
threads, memory plans, and which of ORT's optimisations the graph shows fired."""

from __future__ import annotations

from .memory_plans import MemoryPlan, check_requested_plans, read_memory_plans
from .model_hooks import AGENT_TORCH_THREADS


class TrainingSessionInspection:
    """Mixed into :class:`~.wrap.ORTTrainingModule`, whose ``_ort`` is the ORTModule (or ``None``)
    and ``options`` its ORTOptions. Each view is ``None`` (or empty) before the first training step
    and after a fallback: check graphs, not banners."""

    def _training_manager(self):
        """ORTModule's training execution manager (``None`` if ORT was never brought up)."""
        return self._ort._torch_module._execution_manager(True) if hasattr(self._ort, "_torch_module") else None

    def training_graph(self):
        """The ONNX training graph (forward + gradient) ORT built, with its training optimisations and
        ort_hf's rewrites; the session optimises it once more when it loads it (its fusions drop,
        for one, a weight's Transpose that feeds MatMuls)."""
        onnx_models = getattr(self._training_manager(), "_onnx_models", None)
        return getattr(onnx_models, "optimized_model", None)

    def _session(self):
        agent = getattr(self._training_manager(), "_execution_agent", None)
        return getattr(agent, "_inference_session", None)

    def session_providers(self) -> list[str]:
        """The execution providers of the training session."""
        session = self._session()
        return session.get_providers() if session is not None else []

    def cuda_provider_options(self) -> dict[str, str] | None:
        """The options ORT's CUDA provider runs the training session with (``use_tf32``, ...), as
        ORT reports them; None without a CUDA session."""
        session = self._session()
        return session.get_provider_options().get("CUDAExecutionProvider") if session is not None else None

    def session_threading(self) -> dict | None:
        """The training session's intra-op pool as ORT was asked to run it: ``threads`` (0 = ORT's
        default, one per core) and ``spinning``; and ``torch_threads``, PyTorch's threads while
        ORT runs (``None``: left as they are)."""
        agent = getattr(self._training_manager(), "_execution_agent", None)
        session = getattr(agent, "_inference_session", None)
        if session is None:
            return None
        options = session.get_session_options()
        try:
            spinning = options.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: ORT's default, spinning
            spinning = "1"
        return {
            "threads": options.intra_op_num_threads,
            "spinning": spinning != "0",
            "torch_threads": getattr(agent, AGENT_TORCH_THREADS, None),
        }

    def end_profiling(self) -> str | None:
        """With ``ORTOptions.profile_dir``: end the training session's profiling and return the
        profile file ORT wrote (None without profiling or a session)."""
        session = self._session()
        if session is None or not self.options.profile_dir:
            return None
        return session.end_profiling() or None

    def memory_plans(self) -> list[MemoryPlan] | None:
        """The memory optimizer's plan table, largest saving first."""
        if self.training_graph() is None:
            return None
        return read_memory_plans(self._training_manager())

    def _check_requested_plans(self) -> None:
        if self.options.memory_opt_plans:
            check_requested_plans(self.options.memory_opt_plans, self.memory_plans() or [])

    def label_sparsity_fired(self) -> bool | None:
        """Whether ORT rewrote the loss to run on non-ignored labels only, read from the graph
        (ShrunkenGather before the loss)."""
        graph = self.training_graph()
        return None if graph is None else label_sparsity_in(graph.graph)

    def mem_efficient_grad_active(self) -> bool | None:
        """Whether ORT pulls the parameters through its weight-retrieval PythonOps (memory-efficient
        gradient management), read from the graph."""
        graph = self.training_graph()
        if graph is None:
            return None
        return any(
            node.op_type == "PythonOp" and node.name.startswith("weight_retrieval_") for node in graph.graph.node
        )


def label_sparsity_in(graph) -> bool:
    """Whether ORT's label sparsity rewrote ``graph`` (an ONNX GraphProto): a ShrunkenGather before
    the loss."""
    return any(node.op_type == "ShrunkenGather" for node in graph.node)
