"""The matrix-product work of one training step of a causal LM, and the rate each engine's measured
step ran it at (issue 44): how far a dense-label causal LM's step is from the bound its products set.

The step's FLOPs are counted by PyTorch's ``torch.utils.flop_counter.FlopCounterMode`` over the
model's own forward (its loss included) and backward on one row of the sequence length, times the
batch size (each row's products are its own; the models' forwards read values, so the meta device
cannot stand in). Counted: every matrix product, the LM head's three included (logits, the hidden
states' gradient, the head weight's gradient), which the fused LM-head loss computes too, so both
engines do this work; and attention's two batched products, every query against every key (the
causal mask's skipped half included), from transformers' eager attention, which the count runs
because torch counts nothing for PyTorch's CPU flash-attention kernel. Elementwise work, the norms
and the optimizer are not counted: the rate is a lower bound on what the products ran at.

    python scripts/step_flops.py --model_dir /tmp/heldout/mistral-4x512-v32k --batch_size 8 \
        --seq_len 256 --bench docs/results/kept-flash-heldout-mistral-4x512-v32k/<cpu key>/bench.json

prints the step's GFLOP, each engine's median step and the GFLOP/s it implies, and the step time
(and rate) ORT would need for its target (bench/targets.toml's, 1.3x eager's for a causal LM). With ``--microbench``
(``scripts/weight_grad_microbench.py``'s JSON of that CPU), also the fastest rate a single product
of those shapes reached there, either library. A diagnostic: no figure is checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def step_gflop(config, batch_size: int, seq_len: int) -> float:
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").train()
    ids = torch.randint(config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return batch_size * counter.get_total_flops() / 1e9


def fastest_product_rate(microbench: dict) -> float:
    """GFLOP/s of the fastest single product in a weight_grad_microbench JSON, either library."""
    best = 0.0
    for row in microbench["results"]:
        for key, value in row.items():
            if key.endswith("_ms") and value:
                best = max(best, row["gflop"] / (value / 1000))
    return best


def _speed_target(workload: str) -> float:
    """ORT's samples/s target for ``workload`` in this repository's bench/targets.toml."""
    import tomllib

    targets = tomllib.loads((Path(__file__).resolve().parents[1] / "bench" / "targets.toml").read_text())
    return next(
        t["at_least"] for t in targets["speed"] if t["workload"] == workload and t.get("variant", "ort") == "ort"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model_dir", help="a causal LM's folder")
    model.add_argument("--bench_workload", help="ort-hf bench's causal LM of this workload (clm, clm-gpt2)")
    parser.add_argument("--batch_size", type=int, help="default: the bench workload's")
    parser.add_argument("--seq_len", type=int, help="default: the bench workload's")
    parser.add_argument("--bench", nargs="*", default=[], help="ort-hf bench JSONs of this model and shape")
    parser.add_argument("--microbench", nargs="*", default=[], help="weight_grad_microbench JSONs of the same CPU")
    parser.add_argument(
        "--target",
        type=float,
        help="ORT's samples/s ratio to eager to reach; default: bench/targets.toml's speed target of the workload "
        "(clm for --model_dir)",
    )
    args = parser.parse_args()
    target = args.target or _speed_target(args.bench_workload or "clm")
    if args.bench_workload:
        from kernel_profiles import _bench_model  # the bench's model, built as ort-hf bench builds it

        from ort_hf.bench.spec import WORKLOADS

        workload, config = WORKLOADS[args.bench_workload], _bench_model(args.bench_workload)[2]
        name, batch, seq = args.bench_workload, args.batch_size or workload.batch_size, args.seq_len or workload.seq_len
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(args.model_dir)
        name, batch, seq = Path(args.model_dir).name, args.batch_size, args.seq_len
        if batch is None or seq is None:
            parser.error("--model_dir needs --batch_size and --seq_len")
    gflop = step_gflop(config, batch, seq)
    print(f"{name} at {batch} x {seq}: {gflop:.1f} GFLOP of products a step")
    for path in args.microbench:
        print(
            f"  fastest single product in {path}: {fastest_product_rate(json.loads(Path(path).read_text())):.0f} GFLOP/s"
        )
    for path in args.bench:
        report = json.loads(Path(path).read_text())
        rows = [row for row in report["rows"] if args.model_dir or row["workload"] == args.bench_workload]
        steps = {row["variant"]: row["step_median_ms"] for row in rows}
        print(f"  {path}:")
        for variant, ms in steps.items():
            print(f"    {variant}: median step {ms:.0f} ms, {gflop / (ms / 1000):.0f} GFLOP/s")
        if "eager" in steps:
            need = steps["eager"] / target
            print(f"    {target}x eager's needs a {need:.0f} ms step: {gflop / (need / 1000):.0f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
