"""ort_hf.trl.fused_head reads the settings TRL gave its fused head, and refuses a head it cannot read
naming the tested trl range (no training: TRL's add_fused_lm_head on the tiny chat model)."""

from __future__ import annotations

import types

import pytest

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")

from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head  # noqa: E402
from trl_runs import build_model, build_tokenizer  # noqa: E402

from ort_hf import _versions  # noqa: E402
from ort_hf.trl.fused_head import has_trl_fused_head, read_head_settings  # noqa: E402


def _model():
    return build_model(build_tokenizer())


def test_the_settings_are_the_ones_trl_was_given():
    model = _model()
    assert not has_trl_fused_head(model)
    add_fused_lm_head(model, temperature=0.7, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy"))
    settings = read_head_settings(model)
    assert has_trl_fused_head(model)
    assert (settings.temperature, settings.cast_lm_head_to_fp32, settings.outputs) == (
        0.7,
        True,
        ("log_probs", "entropy"),
    )
    assert settings.output_type is FusedCausalLMOutput and settings.logit_scale == 1.0


def test_a_model_without_the_head_is_refused():
    with pytest.raises(ValueError, match="has no TRL fused LM head"):
        read_head_settings(_model())


def test_a_head_it_cannot_read_is_refused_naming_the_tested_range():
    # A _fused_forward from trl/trainer/utils.py whose closure lacks a setting (as a changed TRL's could).
    source = (
        "def add_fused_lm_head(model, temperature):\n"
        "    def _fused_forward(self, *args, **kwargs):\n"
        "        return temperature\n"
        "    return _fused_forward\n"
    )
    namespace = {}
    exec(compile(source, "/site-packages/trl/trainer/utils.py", "exec"), namespace)
    model = _model()
    model.forward = types.MethodType(namespace["add_fused_lm_head"](model, 1.0), model)
    assert has_trl_fused_head(model)
    with pytest.raises(RuntimeError, match=f"tested with trl{_versions.tested_ranges()['trl']}.*pip install") as info:
        read_head_settings(model)
    assert "cast_lm_head_to_fp32" in str(info.value)
