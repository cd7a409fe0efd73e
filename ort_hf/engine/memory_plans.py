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
