"""`make test-gpu`: run `ort-hf doctor` and the tests marked gpu, then write one file a GPU owner
can attach to a bug report (default ``gpu-report.md``): the doctor's findings, the versions, each
test's result and, for a failure, the first ORT error in it, and what each test recorded (pytest's
``record_property``: the Memcpy nodes ORT inserted, ``tests/parity.py``). Exits with pytest's
status."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The lines that say what ORT (or the CUDA stack under it) objected to.
ORT_ERROR = re.compile(
    r"\[ONNXRuntimeError\].*|ORTModule.*(?:Error|Exception).*|ORTFallbackError.*|"
    r"onnxruntime.*(?:Error|error).*|CUDA failure.*|CUDA error.*|cuDNN.*(?:error|failure).*"
)


def first_ort_error(text: str) -> str | None:
    """The first line of a failure's text that carries ORT's (or CUDA's) own error, or None."""
    for line in text.splitlines():
        match = ORT_ERROR.search(line)
        if match:
            return match.group(0).strip()[:500]
    return None


def test_results(junit_xml: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, detail) per test from pytest's JUnit XML."""
    rows = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                text = f"{element.get('message', '')}\n{element.text or ''}"
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                if tag == "skipped":
                    detail = element.get("message", "")
                else:
                    first_line = element.get("message", "").splitlines()[0] if element.get("message") else ""
                    detail = first_ort_error(text) or first_line[:500]
                break
        rows.append((name, outcome, detail))
    return rows


def recorded(junit_xml: Path) -> dict[str, dict[str, list | str]]:
    """test id -> what it recorded (JUnit ``property`` elements): a JSON list, the lists of one name
    joined (a test may record once per run it makes), else the text as it is."""
    found: dict[str, dict[str, list | str]] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for prop in case.iter("property"):
            key, text = prop.get("name", ""), prop.get("value", "")
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = text
            values = found.setdefault(name, {})
            if isinstance(value, list) and isinstance(values.get(key, []), list):
                values[key] = [*values.get(key, []), *value]
            else:
                values[key] = text
    return found


def _summary(values: dict[str, list | str]) -> str:
    return ", ".join(f"{key}: {len(value) if isinstance(value, list) else value}" for key, value in values.items())


def render(
    doctor: str,
    rows: list[tuple[str, str, str]],
    pytest_tail: str,
    records: dict[str, dict[str, list | str]] | None = None,
) -> str:
    counts = {o: sum(1 for _, outcome, _ in rows if outcome == o) for o in ("passed", "FAILED", "ERROR", "skipped")}
    lines = [
        f"# ort_hf GPU report ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        "`make test-gpu`: `ort-hf doctor`, then `pytest -m gpu`. "
        + ", ".join(f"{n} {o.lower()}" for o, n in counts.items()),
        "",
        "## ort-hf doctor",
        "",
        "```",
        doctor.rstrip(),
        "```",
        "",
        "## Tests",
        "",
        "| test | result | first ORT error / reason | recorded |",
        "| --- | --- | --- | --- |",
    ]
    records = records or {}
    lines += [
        f"| `{name}` | {outcome} | {detail.replace('|', '/')} | {_summary(records.get(name, {}))} |"
        for name, outcome, detail in rows
    ]
    listed = [
        (name, key, value)
        for name, values in records.items()
        for key, value in values.items()
        if isinstance(value, list) and value
    ]
    if listed:
        lines += ["", "## Recorded by the tests", ""]
        for name, key, value in listed:
            lines += [f"`{name}`, {key} ({len(value)}):", "", "```", *map(str, value), "```", ""]
    lines += ["", "## pytest's last lines", "", "```", pytest_tail.rstrip(), "```", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-report.md")
    parser.add_argument("pytest_args", nargs="*", default=["tests", "-m", "gpu"])
    cli = parser.parse_args()
    doctor = subprocess.run([sys.executable, "-m", "ort_hf.cli", "doctor"], capture_output=True, text=True, cwd=ROOT)
    print(doctor.stdout, doctor.stderr[-2000:], sep="", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        # xunit1: the JUnit family in which pytest writes record_property's values without a warning.
        tests = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *cli.pytest_args,
                f"--junitxml={junit}",
                "-o",
                "junit_family=xunit1",
                "-rA",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        print(tests.stdout[-6000:], tests.stderr[-2000:], sep="", flush=True)
        rows = test_results(junit) if junit.exists() else []
        records = recorded(junit) if junit.exists() else {}
    doctor_text = doctor.stdout + (
        f"\n(exit {doctor.returncode})\n{doctor.stderr[-1500:]}" if doctor.returncode else ""
    )
    cli.out.write_text(render(doctor_text, rows, "\n".join(tests.stdout.splitlines()[-15:]), records))
    print(f"gpu report written to {cli.out}: attach it to the bug report", flush=True)
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main())
