"""Every ratio quoted in README.md and docs/*.md comes from a committed benchmark result.

docs/results/<set>/<cpu kind>/bench.json are the raw outputs of the `ort-hf bench` commands named in
docs/benchmarks.md (each set an --out folder, a folder per CPU kind in it); each bench.md next to one
is that run's table, and must be exactly what `ort-hf bench` renders from the JSON, and each set's
by-cpu.md what `ort-hf bench --render_only` renders from its folders. A ratio ("2.19x") or a results-table row in the docs that
no committed result produces fails here."""

import json
import re
from pathlib import Path

from ort_hf.bench.by_cpu import BY_CPU_FILE, load_results, markdown_by_cpu
from ort_hf.bench.render import markdown
from ort_hf.bench.spec import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
RATIO = re.compile(r"(?<![\w.])\d+\.\d+x\b")
WORKLOAD_ROW = re.compile(rf"\| ({'|'.join(map(re.escape, WORKLOADS))}) \|")
RANGE = re.compile(r"(?<![\w.])\d+\.\d+–\d+\.\d+(?![\w.])")  # a per-round range, as the bench prints it


def _rendered() -> dict[str, str]:
    tables = {}
    for path in sorted(RESULTS.glob("*/*/bench.json")):
        report = json.loads(path.read_text())
        tables[str(path.with_suffix(".md").relative_to(RESULTS))] = markdown(
            report["rows"], report["targets"], report["conditions"]
        )
    for folder in sorted({path.parent.parent for path in RESULTS.glob("*/*/bench.json")}):
        tables[str((folder / BY_CPU_FILE).relative_to(RESULTS))] = markdown_by_cpu(load_results(folder))
    return tables


def test_each_committed_table_is_what_the_bench_renders_from_its_json():
    tables = _rendered()
    assert tables, f"no benchmark results committed in {RESULTS}"
    for name, text in tables.items():
        assert (RESULTS / name).read_text() == text, f"{name} differs from its JSON's rendering"


def test_quoted_ratios_and_table_rows_come_from_the_committed_results():
    rendered = "\n".join(_rendered().values())
    # scripts/first_step_split.py's printed tables, beside their raw JSON
    splits = "\n".join(path.read_text() for path in sorted(RESULTS.glob("first-step/*/split*.md")))
    produced = set(RATIO.findall(rendered + splits)) | set(RANGE.findall(rendered + splits))
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = doc.read_text()
        quoted = set(RATIO.findall(text)) | set(RANGE.findall(text))
        assert quoted <= produced, (
            f"{doc.name} quotes ratios or ranges no committed result has: {sorted(quoted - produced)}"
        )
        rows = [line for line in text.splitlines() if WORKLOAD_ROW.match(line)]
        missing = [row for row in rows if row not in rendered]
        assert not missing, f"{doc.name} has result rows no committed result renders: {missing}"
