"""--ort_profile_dir: ORT's per-node profile of the training session, written when train() ends."""

import json
import logging
from pathlib import Path

from tiny_models import FAMILIES, build, id_dataset, tiny_args

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def test_profile_dir_writes_orts_per_node_profile_of_the_training_steps(tmp_path, caplog):
    args = tiny_args(
        ORTTrainingArguments,
        tmp_path / "out",
        max_steps=2,
        per_device_train_batch_size=4,
        ort_profile_dir=str(tmp_path / "profile"),
    )
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=id_dataset(8))
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        trainer.train()
    assert trainer.ort_engine_status().backend == "ort"
    (said,) = [r.getMessage() for r in caplog.records if "per-node profile" in r.getMessage()]
    profile = Path(said.split("run: ")[1].split(" (")[0])
    assert profile.parent == tmp_path / "profile"
    events = json.loads(profile.read_text())
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    ops = {e["args"]["op_name"] for e in kernels}
    assert {"MatMul", "SoftmaxGrad_13"} & ops and any(op.endswith("Grad") for op in ops), sorted(ops)
    # Two steps, each a forward and a backward run of the training session's executor.
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "SequentialExecutor::Execute"]
    assert len(runs) == 4


def test_without_profile_dir_nothing_is_profiled(tmp_path):
    args = tiny_args(ORTTrainingArguments, tmp_path / "out", max_steps=1, per_device_train_batch_size=4)
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=id_dataset(4))
    trainer.train()
    assert trainer.ort_engine.end_profiling() is None
    assert not list(tmp_path.rglob("ort_training_profile*"))
