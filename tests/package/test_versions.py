"""ort_hf/_versions.py: the tested ranges are pyproject.toml's, read back from the installed
metadata, and a library outside its range is named with the pin to install."""

from ort_hf import _versions
from ort_hf._versions import WRITTEN_AGAINST, untested

REQUIREMENTS = [
    "torch<2.14,>=2.13.0",
    "numpy>=2.0",
    'trl<1.17,>=1.16.0; extra == "trl"',
    'peft<0.22,>=0.21; extra == "peft"',
]


def test_every_library_ort_hf_is_written_against_has_a_floor_and_a_cap():
    ranges = _versions.tested_ranges()  # this install's own metadata
    assert set(ranges) == set(WRITTEN_AGAINST)
    for name, spec in ranges.items():
        assert ">=" in spec and "<" in spec.replace("<=", ""), f"{name}: {spec} needs a tested floor and cap"


def test_an_untested_version_is_named_with_its_pin():
    lines = untested({"torch": "2.15.0", "trl": "1.16.0", "numpy": "3.0"}, REQUIREMENTS)
    assert lines == ["torch 2.15.0 is outside the tested range <2.14,>=2.13.0: pip install 'torch<2.14,>=2.13.0'"]


def test_local_build_tags_and_absent_extras_pass():
    assert untested({"torch": "2.13.0+cpu"}, REQUIREMENTS) == []
    assert untested({"peft": "0.20.0"}, REQUIREMENTS)[0].startswith("peft 0.20.0 is outside")


def test_env_prints_one_block_for_a_bug_report(capsys):
    from ort_hf.cli import main

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ort-hf env\n")
    for name in ("torch", "transformers", "onnxruntime-training-cpu", "ORT build", "extension cache"):
        assert f"\n  {name} " in out
    assert "(tested: " in out
