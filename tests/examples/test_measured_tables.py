"""The "Results measured here" tables of run_glue's and run_mlm's READMEs are the committed run
summaries (results/<config>/<engine>.json, the ort_hf_summary.json of the README's --compare
commands), and every ratio their text quotes is one of those runs' ORT/PyTorch ratios."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"dropout-default": "default dropout (0.1)", "dropout-0": "dropout 0"}
ENGINES = {"ort": "ORT", "pytorch": "PyTorch"}


def _glue_row(config, engine, s):
    return (
        f"| {config} | {engine} | {s['run_samples_per_s']:.1f} | {s['samples_per_s']:.1f} | "
        f"{s['non_padding_tokens_per_s']:,.0f} | {s['peak_memory_mb']:,.0f} | {100 * s['metric_value']:.2f}% |"
    )


def _mlm_row(config, engine, s):
    sparsity = "fired" if s["label_sparsity"] else "-"
    return (
        f"| {config} | {engine} | {s['samples_per_s']:.2f} | {s['non_padding_tokens_per_s']:,.0f} | "
        f"{s['peak_memory_mb']:,.0f} | {sparsity} | {s['metric_value']:.2f} |"
    )


@pytest.mark.parametrize("example, row", [("run_glue", _glue_row), ("run_mlm", _mlm_row)])
def test_readme_tables_and_ratios_are_the_committed_runs(example, row):
    folder = ROOT / "examples" / example
    readme = (folder / "README.md").read_text()
    ratios = set()
    for config_dir, config in CONFIGS.items():
        runs = {e: json.loads((folder / "results" / config_dir / f"{e}.json").read_text()) for e in ENGINES}
        assert runs["ort"]["engine"] == "ort" and runs["pytorch"]["engine"] == "pytorch"
        for engine, label in ENGINES.items():
            expected = row(config, label, runs[engine])
            assert expected in readme, f"{example}/README.md lacks the committed row {expected}"
        for key in ("run_samples_per_s", "samples_per_s"):
            if runs["ort"].get(key):
                ratios.add(f"{runs['ort'][key] / runs['pytorch'][key]:.2f}x")
        ratios.add(f"{runs['ort']['peak_memory_mb'] / runs['pytorch']['peak_memory_mb']:.2f}x")
    quoted = set(re.findall(r"(?<![\w.])\d+\.\d+x\b", readme))
    assert quoted <= ratios, f"{example}/README.md quotes ratios no committed run gives: {sorted(quoted - ratios)}"
