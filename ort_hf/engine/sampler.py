"""ORT's LoadBalancingDistributedBatchSampler, for the Trainer's train dataloader.

Each rank gets batches of samples sorted by complexity (default: non-padding tokens), so
ranks finish their steps at the same time and padding within a batch is small.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers.trainer_pt_utils import BatchRebalanceSampler


def token_count(sample: dict) -> int:
    """Default complexity: the sample's non-padding tokens."""
    mask = sample.get("attention_mask")
    if mask is not None:
        return int(sum(mask))
    return len(sample["input_ids"])


class LoadBalancingBatchSampler(BatchRebalanceSampler):
    """Adapts ORT's batch sampler to the Trainer's contract for rank-aware batch samplers
    (``BatchRebalanceSampler`` instances are passed as ``batch_sampler`` and not re-sharded)."""

    def __init__(
        self,
        dataset,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
        complexity_fn: Callable[[dict], int] = token_count,
    ):
        from .runtime import ensure_engine

        ensure_engine()
        from onnxruntime.training.utils.data import (
            LoadBalancingDistributedBatchSampler,
            LoadBalancingDistributedSampler,
        )

        sampler = LoadBalancingDistributedSampler(
            dataset, complexity_fn=complexity_fn, world_size=world_size, rank=rank, shuffle=True, seed=seed
        )
        # Deliberately not calling BatchRebalanceSampler.__init__: only its type is borrowed.
        self._inner = LoadBalancingDistributedBatchSampler(
            sampler, batch_fn=lambda idx: [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]
        )

    def __iter__(self):
        return iter(self._inner)

    def __len__(self) -> int:
        return len(self._inner)

    def set_epoch(self, epoch: int) -> None:
        from .compat import make_sampler_reusable

        make_sampler_reusable(self._inner.sampler)
        self._inner.set_epoch(epoch)
