"""TRL's config classes through ORTTrainerMixin's binding: the declared ORT configs are found, a TRL
config ort_hf does not declare (a user's subclass of SFTConfig) gets one derived with TRL's unset-bf16
rule, and the core's derivation holds no TRL knowledge (ort_hf/trl declares it)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ort_hf[trl]')")

from ort_hf.trainer.parent_binding import ort_args_class_for, parent_config_class  # noqa: E402
from ort_hf.trl import ORTDPOConfig, ORTDPOTrainer, ORTSFTConfig, ORTSFTTrainer  # noqa: E402
from ort_hf.trl.arguments import ORTTRLArguments  # noqa: E402


@dataclass
class MySFTConfig(trl.SFTConfig):
    my_option: int = field(default=3, metadata={"help": "A recipe's own option."})


def test_the_declared_configs_are_found():
    assert ort_args_class_for(trl.SFTConfig) is ORTSFTConfig
    assert ort_args_class_for(trl.DPOConfig) is ORTDPOConfig


def test_the_parents_annotation_is_read_as_a_type():
    # SFTTrainer's `args: SFTConfig | TrainingArguments | None`, a string in its module.
    assert parent_config_class(trl.SFTTrainer.__init__) is trl.SFTConfig
    assert parent_config_class(trl.DPOTrainer.__init__) is trl.DPOConfig
    assert ORTSFTTrainer.ort_args_class is ORTSFTConfig and ORTDPOTrainer.ort_args_class is ORTDPOConfig


def test_a_trl_config_not_declared_gets_trls_unset_bf16_rule(tmp_path):
    derived = ort_args_class_for(MySFTConfig)
    assert issubclass(derived, ORTTRLArguments) and issubclass(derived, MySFTConfig)
    args = derived(output_dir=str(tmp_path), use_cpu=True, report_to=[], my_option=5)
    assert args.bf16 is False and args.my_option == 5  # TRL's own __post_init__ would make bf16 True
    assert MySFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]).bf16 is True
    assert pickle.loads(pickle.dumps(args)).my_option == 5  # the Trainer saves its args


def test_every_declared_trl_config_has_trls_rule():
    """A config declared in ort_hf.trl.configs derives from ORTTRLArguments (TRL's unset bf16 settled for ORT)."""
    from ort_hf.trainer import ORTTrainingArguments
    from ort_hf.trl import configs

    declared = [
        c
        for c in vars(configs).values()
        if isinstance(c, type) and issubclass(c, ORTTrainingArguments) and c.__module__ == configs.__name__
    ]
    assert declared and all(issubclass(c, ORTTRLArguments) for c in declared), declared
