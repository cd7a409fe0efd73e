"""ORT's memory-optimizer (recompute) plans, as ORT reports them for a training graph."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryPlan:
    """One recompute plan ORT's memory optimizer found in the training graph (first batch)."""

    plan: str  # as ORT prints it and as memory_opt_plans takes it, "cluster:strategy:count"
    frequency: int  # how many times the subgraph occurs
    bytes_saved: float | None  # evaluated on the first batch's shapes
    symbolic_saving: str  # saving as a formula of the symbolic dims
    enabled: bool


def plan_key(plan: str) -> list[str]:
    return [":".join(part.split(":")[:2]) for part in plan.split(",") if part]


def read_memory_plans(manager) -> list[MemoryPlan]:
    """The plans ORT's memory optimizer found in ``manager``'s training graph (ORTModule's training
    execution manager, after the first training step), and whether each is enabled: by the level,
    or by the plan file ORT was given (``ORTOptions.memory_opt_plans``). Plans whose reading was
    put off at session creation (``model_hooks._one_session_build``) are read now."""
    observer = manager._runtime_inspector.memory_ob
    if getattr(manager, "_ort_hf_plans_pending", False):
        observer.find_memory_optimization_opportunity(manager._execution_agent, manager._runtime_options)
        manager._ort_hf_plans_pending = False
    found = observer.cluster_id_combination_to_saving_symbolics_map
    enabled: set[str] = set()
    config = manager._runtime_options.memory_optimizer_config_file_path
    if config:
        import json

        with open(config) as f:
            for entry in json.load(f):
                enabled.update(k for k, part in zip(plan_key(entry), entry.split(",")) if not part.endswith(":0"))
    return [
        MemoryPlan(
            plan=cluster,
            frequency=int(summary.freq),
            bytes_saved=summary.evaluated_saving if isinstance(summary.evaluated_saving, float) else None,
            symbolic_saving=str(summary.simplified_symbolic_saving_expr),
            enabled=bool(plan_key(cluster)) and all(k in enabled for k in plan_key(cluster)),
        )
        for cluster, summary in found.items()
    ]


def check_requested_plans(requested: tuple[str, ...], found: list[MemoryPlan]) -> None:
    """A requested plan ORT did not find is a typo or a model change: say which plans exist."""
    import difflib

    known = {k for p in found for k in plan_key(p.plan)}
    for plan in requested:
        missing = [k for k in plan_key(plan) if k not in known]
        if missing:
            valid = ", ".join(p.plan for p in found) or "none (the graph has no recomputable subgraph)"
            close = difflib.get_close_matches(missing[0], sorted(known), n=1)
            hint = f" Did you mean '{close[0]}:-1'?" if close else ""
            raise ValueError(
                f"ORTOptions.memory_opt_plans: ORT found no plan '{plan}' in this model.{hint} Valid plans: {valid}."
            )
