"""One line naming what ORT could not handle, from the exception its export or session raised."""

from __future__ import annotations

import re

_OP_RE = re.compile(r"(aten::\w+|prim::\w+|onnx::\w+)")
_NO_GRADIENT_RE = re.compile(r"gradient builder has not been registered: (\w+) for node (\S+)")
_ERROR_LINE_RE = re.compile(r"^\s*((?:\w+\.)*\w+(?:Error|Exception): .+)$", re.M)
_CPP_CHECK_RE = re.compile(r"^/onnxruntime_src/\S+ .*? was false\. ", re.S)


def describe_failure(exc: BaseException) -> str:
    """One line naming what ORT could not handle, with the unsupported op when there is one."""
    text = str(exc)
    no_grad = _NO_GRADIENT_RE.search(text)
    if no_grad:
        return f"ORT has no gradient for ONNX op {no_grad.group(1)} (node {no_grad.group(2)})"
    text = _CPP_CHECK_RE.sub("", text)  # drop ORT's C++ file and function signature
    # ORT wraps the exporter's traceback into its message: the root cause is its last error line.
    causes = _ERROR_LINE_RE.findall(text)
    if causes:
        text = causes[-1]
    ops = [op for op in _OP_RE.findall(text) if op not in ("prim::PythonOp", "prim::Constant")]
    head = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if ops:
        return f"unsupported op {ops[0]} ({type(exc).__name__}: {head[:300]})"
    return f"{type(exc).__name__}: {head[:300]}"
