"""memory/run_peak_mb is the whole run's peak: a spike during evaluation shows in it, and it agrees
with the process's RSS sampled from outside."""

import json
import subprocess
import sys
import time

import psutil

SCRIPT = r"""
import sys, numpy as np, torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments
from ort_hf.callbacks import MemoryObserverCallback
SPIKE_MB = 400

def spike(eval_pred):  # evaluation allocates and touches 400 MB, well above any training step
    block = np.ones(SPIKE_MB * 2**20 // 8)
    return {"spike": float(block[::4096].sum())}

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 2)
    def forward(self, x, labels=None):
        logits = self.linear(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

data = Dataset.from_dict({"x": torch.randn(32, 8).tolist(), "labels": [i % 2 for i in range(32)]})
args = TrainingArguments(output_dir=sys.argv[1], max_steps=6, per_device_train_batch_size=4, logging_steps=1,
                         eval_strategy="steps", eval_steps=3, report_to=[], save_strategy="no", disable_tqdm=True)
trainer = Trainer(model=Net(), args=args, train_dataset=data, eval_dataset=data, compute_metrics=spike,
                  callbacks=[MemoryObserverCallback(skip_steps=0)])
trainer.train()
print(json.dumps(trainer.state.log_history))
""".replace("import sys,", "import json, sys,")


def test_run_peak_includes_evaluation_and_matches_outside_rss(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    watched, outside = psutil.Process(proc.pid), 0.0
    while proc.poll() is None:
        try:
            outside = max(outside, watched.memory_info().rss / 2**20)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.005)
    out, _ = proc.communicate()
    assert proc.returncode == 0
    history = json.loads(out.strip().splitlines()[-1])
    steps = [h for h in history if "memory/run_peak_mb" in h]
    before_eval = next(h for h in steps if h["step"] == 3)
    after_eval = next(h for h in steps if h["step"] == 4)
    assert after_eval["memory/run_peak_mb"] >= before_eval["memory/peak_mb"] + 300  # the evaluation spike
    run_peak = max(h["memory/run_peak_mb"] for h in steps)
    assert run_peak >= 0.97 * outside, (run_peak, outside)  # the sampler cannot see more than the true peak
    assert run_peak <= outside + 150, (run_peak, outside)  # nor far less, with 5 ms sampling over a 400 MB spike
