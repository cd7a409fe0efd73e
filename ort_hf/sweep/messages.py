"""Error messages in a line: what a table cell or a progress line shows of them."""

from __future__ import annotations

import re

# Wrappers around the reason (ORTTrainer's, the engine's, ORT's C++ check) that a table cell drops;
# the JSONL keeps the whole message.
_NOISE = (
    (re.compile(r"^ORT failed at step \d+: "), ""),
    (re.compile(r"^ORT could not run \w+ and fallback is disabled: "), ""),
    (re.compile(r"Error in forward pass execution: |Error in backward pass execution: "), ""),
    (
        re.compile(r"Non-zero status code returned while running (\w+) node\. Name:'([^']*)' Status Message: "),
        r"\1 node '\2': ",
    ),
    (re.compile(r"/onnxruntime_src/\S+ .*? was false\. "), ""),
    (re.compile(r"'/_original_module/"), "'/"),
)


def condense(detail: str | None, limit: int = 120) -> str:
    """A cell's reason in a line: the wrappers dropped, cut at ``limit`` characters."""
    text = (detail or "").replace("\n", " ")
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
