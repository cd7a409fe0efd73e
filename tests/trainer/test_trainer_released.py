"""After ``train()``, dropping the trainer frees the model and the optimizer, as with ``Trainer``.

ORT is imported by the first ``train()`` of a process, inside the training loop; what that import
keeps for the process's life must not hold the loop's frames (``runtime.is_ort_training_available``
says how it did). A fresh process, because only a process's first import shows it.
"""

from __future__ import annotations

import subprocess
import sys

from launch import ROOT, _env

CHILD = """
import gc, sys, weakref
from tiny_models import FAMILIES, build, rule_dataset, tiny_args
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

assert "onnxruntime" not in sys.modules
model = build(FAMILIES["bert-cls"])
args = tiny_args(ORTTrainingArguments, sys.argv[1], max_steps=2, use_cpu=True, optim="adamw_torch")
trainer = ORTTrainer(model=model, args=args, train_dataset=rule_dataset())
trainer.train()
assert trainer.ort_engine.engine_status().backend == "ort"
refs = {"model": weakref.ref(model), "optimizer": weakref.ref(trainer.optimizer)}
del model, trainer
gc.collect()
print("ALIVE", sorted(name for name, ref in refs.items() if ref() is not None))
"""


def test_dropped_trainer_frees_model_and_optimizer(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    verdict = [line for line in run.stdout.splitlines() if line.startswith("ALIVE")]
    assert verdict == ["ALIVE []"], run.stdout[-3000:]
