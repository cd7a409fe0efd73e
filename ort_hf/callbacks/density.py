"""InputDensityCallback: how much of each batch is real tokens, in the Trainer's logs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..engine import SPARSITY_THRESHOLD
from ..module_with_loss import IGNORE_INDEX
from .observer import BatchObserver, all_reduce_sum

logger = logging.getLogger(__name__)

TABLE_HEADER = (
    "STEP",
    "INPUT TYPE",
    "INPUT NAME",
    "PAD IDX",
    "DENSITY",
    "VALID TOKENS",
    "TOTAL TOKENS",
    "VALID TOKENS/BATCH",
)


@dataclass
class Counts:
    """Valid and total tokens, and samples, of one input over some forwards."""

    valid: float = 0.0
    total: float = 0.0
    samples: float = 0.0

    def add(self, valid: int, total: int, samples: int) -> None:
        self.valid += valid
        self.total += total
        self.samples += samples

    @property
    def density(self) -> float:
        return self.valid / self.total if self.total else float("nan")


def count_valid(tensor: torch.Tensor, pad_value: int | None) -> tuple[int, int, int]:
    """(valid, total, samples) of an id tensor: valid are the entries not equal to ``pad_value``."""
    total = tensor.numel()
    valid = total if pad_value is None else int(torch.count_nonzero(tensor != pad_value))
    samples = tensor.shape[0] if tensor.dim() else 1
    return valid, total, samples


class InputDensityCallback(BatchObserver):
    """Per step: valid/total tokens of the embedding input (``input_ids`` vs the model's pad id)
    and of the labels (vs -100); per logging window, merged into the Trainer's logs as
    ``density/embed``, ``density/label``, ``tokens/non_padding_per_s``, ``throughput/samples_per_s``,
    and ``throughput/run_samples_per_s``: the timed samples over the timed seconds of every step so
    far. Two runs of the same steps compare on this one: with length-grouped batches the windows'
    rates vary several-fold, so the median window of one run is not the same steps as another's.

    Works under plain ``Trainer`` and ``ORTTrainer``; numbers are summed over ranks. The first
    ``skip_steps`` steps (ORT export, warm-up) are left out of the throughput timing.
    ``print_every`` prints the per-step table on rank 0 every N steps.
    """

    def __init__(self, print_every: int | None = None, skip_steps: int = 1):
        super().__init__()
        self.print_every = print_every
        self.skip_steps = skip_steps
        self.pad_token_id: int | None = None
        self._step = {"embed": Counts(), "label": Counts()}
        self._window = {"embed": Counts(), "label": Counts()}
        self._window_seconds = 0.0
        self._window_timed_samples = 0.0
        self._window_timed_tokens = 0.0
        self._run_timed_samples = 0.0
        self._run_seconds = 0.0
        self._step_start = 0.0
        self._advised = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        config = getattr(model, "config", None)
        self.pad_token_id = getattr(config, "pad_token_id", None)
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def before_forward(self, inputs: dict) -> None:
        ids = inputs.get("input_ids")
        if torch.is_tensor(ids):
            pad = self.pad_token_id
            if pad is None and torch.is_tensor(inputs.get("attention_mask")):
                ids, pad = inputs["attention_mask"], 0
            self._step["embed"].add(*count_valid(ids, pad))
        labels = inputs.get("labels")
        if torch.is_tensor(labels) and not labels.is_floating_point():
            self._step["label"].add(*count_valid(labels, IGNORE_INDEX))

    def on_step_begin(self, args, state, control, **kwargs):
        self._step = {"embed": Counts(), "label": Counts()}
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = time.perf_counter() - self._step_start
        for key, counts in self._step.items():
            self._window[key].add(counts.valid, counts.total, counts.samples)
        if state.global_step > self.skip_steps:
            self._window_seconds += elapsed
            self._window_timed_samples += self._step["embed"].samples
            self._window_timed_tokens += self._step["embed"].valid
        if self.print_every and state.global_step % self.print_every == 0 and state.is_world_process_zero:
            print(self.format_table(state.global_step, self._step))

    def collect(self, args, state, logs: dict) -> dict:
        out: dict[str, float] = {}
        w = self._window
        sums = all_reduce_sum(
            [
                w["embed"].valid,
                w["embed"].total,
                w["label"].valid,
                w["label"].total,
                self._window_timed_tokens,
                self._window_timed_samples,
                self._window_seconds,
            ]
        )
        embed_valid, embed_total, label_valid, label_total, tokens, samples, seconds = sums
        world = max(1, args.world_size)
        if embed_total:
            out["density/embed"] = round(embed_valid / embed_total, 4)
            out["tokens/non_padding"] = embed_valid
        if label_total:
            out["density/label"] = round(label_valid / label_total, 4)
        if seconds:
            # seconds are summed over ranks that ran in parallel: divide by the mean rank time.
            out["tokens/non_padding_per_s"] = round(tokens / (seconds / world), 2)
            out["throughput/samples_per_s"] = round(samples / (seconds / world), 3)
            self._run_timed_samples += samples
            self._run_seconds += seconds / world
            out["throughput/run_samples_per_s"] = round(self._run_timed_samples / self._run_seconds, 3)
        if not self._advised and state.is_world_process_zero:
            self._advise({**logs, **out})
        self._window = {"embed": Counts(), "label": Counts()}
        self._window_seconds = self._window_timed_samples = self._window_timed_tokens = 0.0
        return out

    def _advise(self, logs: dict) -> None:
        self._advised = True
        embed, label = logs.get("density/embed", 1.0), logs.get("density/label", 1.0)
        if embed < SPARSITY_THRESHOLD:
            logger.warning(
                "ort_hf: %.0f%% of input tokens are padding. Pad per batch (DataCollatorWithPadding, "
                "padding='longest'), group by length (--group_by_length), or balance batches with "
                "--ort_load_balancing_sampler; ORT's padding elimination only runs on CUDA.",
                100 * (1 - embed),
            )
        # TRL's fused head computed on the used rows in the graph (ort/head_on_used_rows) is the same saving
        if label < SPARSITY_THRESHOLD and 1.0 not in (
            logs.get("ort/label_sparsity"),
            logs.get("ort/head_on_used_rows"),
        ):
            logger.warning(
                "ort_hf: only %.0f%% of label positions are used and ORT's label sparsity is not active: "
                "train with ORTTrainer and ModuleWithLoss (--use_module_with_loss true, the default).",
                100 * label,
            )

    def format_table(self, step: int, counts: dict[str, Counts]) -> str:
        rows = [TABLE_HEADER]
        for kind, name, pad in (("EMBED", "input_ids", self.pad_token_id), ("LABEL", "labels", IGNORE_INDEX)):
            c = counts[kind.lower()]
            if c.total:
                per_batch = c.valid / c.samples if c.samples else float("nan")
                rows.append(
                    (
                        str(step),
                        kind,
                        name,
                        str(pad),
                        f"{100 * c.density:.2f}%",
                        str(int(c.valid)),
                        str(int(c.total)),
                        f"{per_batch:.1f}",
                    )
                )
        widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
        return "\n".join(" | ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows)
