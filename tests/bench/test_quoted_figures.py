"""Every ratio quoted in README.md and docs/*.md comes from a committed benchmark result.

docs/results/*.json are the raw outputs of the `ort-hf bench` commands named in
docs/benchmarks.md; each .md next to one is that run's table, and must be exactly what
`ort-hf bench` renders from the JSON. A ratio ("2.19x") or a results-table row in the docs that
no committed result produces fails here."""

import json
import re
from pathlib import Path

from ort_hf.bench.render import markdown
from ort_hf.bench.spec import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
RATIO = re.compile(r"(?<![\w.])\d+\.\d+x\b")
WORKLOAD_ROW = re.compile(rf"\| ({'|'.join(map(re.escape, WORKLOADS))}) \|")
RANGE = re.compile(r"(?<![\w.])\d+\.\d+–\d+\.\d+(?![\w.])")  # a per-round range, as the bench prints it


def _rendered() -> dict[str, str]:
    tables = {}
    for path in sorted(RESULTS.glob("*.json")):
        report = json.loads(path.read_text())
        tables[path.stem] = markdown(report["rows"], report["targets"], report["conditions"])
    return tables


def test_each_committed_table_is_what_the_bench_renders_from_its_json():
    tables = _rendered()
    assert tables, f"no benchmark results committed in {RESULTS}"
    for name, text in tables.items():
        assert (RESULTS / f"{name}.md").read_text() == text, f"{name}.md differs from its JSON's rendering"


def test_quoted_ratios_and_table_rows_come_from_the_committed_results():
    rendered = "\n".join(_rendered().values())
    produced = set(RATIO.findall(rendered)) | set(RANGE.findall(rendered))
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = doc.read_text()
        quoted = set(RATIO.findall(text)) | set(RANGE.findall(text))
        assert quoted <= produced, f"{doc.name} quotes ratios or ranges no committed result has: {sorted(quoted - produced)}"
        rows = [line for line in text.splitlines() if WORKLOAD_ROW.match(line)]
        missing = [row for row in rows if row not in rendered]
        assert not missing, f"{doc.name} has result rows no committed result renders: {missing}"
