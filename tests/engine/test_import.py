"""`import ort_hf` is cheap and works without onnxruntime-training; first use says what to install."""

import subprocess
import sys
import textwrap

HIDE_ORT = textwrap.dedent(
    """
    import importlib.abc, sys
    class HideOnnxruntime(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "onnxruntime" or name.startswith("onnxruntime."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, HideOnnxruntime())
    """
)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_ORT + textwrap.dedent(code)], capture_output=True, text=True)


def test_import_without_onnxruntime_loads_nothing_heavy():
    proc = _run(
        """
        import ort_hf, ort_hf.engine
        heavy = {"onnxruntime", "torch", "transformers", "numpy", "onnx"} & set(sys.modules)
        assert not heavy, sorted(heavy)
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_first_engine_use_names_the_extra():
    proc = _run(
        """
        import torch
        from ort_hf.engine import EngineUnavailableError, wrap_model
        try:
            wrap_model(torch.nn.Linear(2, 2))
        except EngineUnavailableError as exc:
            print(exc)
        else:
            raise SystemExit("no error")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "ort_hf[cpu]" in proc.stdout and "ort_hf[gpu]" in proc.stdout
