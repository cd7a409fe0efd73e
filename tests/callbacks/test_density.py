"""InputDensityCallback counts exactly on hand-built batches."""

from types import SimpleNamespace

import torch

from ort_hf.callbacks import InputDensityCallback

PAD = 0


def _state(step):
    return SimpleNamespace(global_step=step, is_world_process_zero=True, log_history=[])


def test_counts_on_a_batch_with_known_padding():
    cb = InputDensityCallback(skip_steps=0)
    cb.pad_token_id = PAD
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, PAD, PAD], [5, PAD, PAD, PAD]])  # 7 of 12 real
    labels = torch.tensor([[-100, 6, -100, -100], [5, -100, -100, -100], [-100, -100, -100, -100]])  # 2 of 12
    args = SimpleNamespace(world_size=1)
    cb.on_step_begin(args, _state(0), None)
    cb.before_forward({"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": labels})
    cb.before_forward({"input_ids": ids[:1], "labels": labels[:1]})  # a second micro-batch: 4/4 and 1/4
    cb.on_step_end(args, _state(1), None)
    out = cb.collect(args, _state(1), {"loss": 1.0})
    assert out["density/embed"] == round(11 / 16, 4)
    assert out["density/label"] == round(3 / 16, 4)
    assert out["tokens/non_padding"] == 11
    assert out["tokens/non_padding_per_s"] > 0 and out["throughput/samples_per_s"] > 0
    table = cb.format_table(1, cb._step).splitlines()
    assert table[0].split(" | ")[0].strip() == "STEP" and "VALID TOKENS/BATCH" in table[0]
    embed_row = [c.strip() for c in table[1].split(" | ")]
    assert embed_row == ["1", "EMBED", "input_ids", "0", "68.75%", "11", "16", "2.8"]
    # the window resets after a log
    assert cb.collect(args, _state(1), {"loss": 1.0}) == {}


def test_without_pad_id_uses_attention_mask():
    cb = InputDensityCallback(skip_steps=0)
    cb.pad_token_id = None
    mask = torch.tensor([[1, 1, 0, 0]])
    cb.on_step_begin(None, _state(0), None)
    cb.before_forward({"input_ids": torch.tensor([[9, 9, 9, 9]]), "attention_mask": mask})
    cb.on_step_end(None, _state(1), None)
    assert cb.collect(SimpleNamespace(world_size=1), _state(1), {"loss": 0.0})["density/embed"] == 0.5


def test_first_steps_are_left_out_of_throughput():
    cb = InputDensityCallback(skip_steps=1)
    cb.pad_token_id = PAD
    args = SimpleNamespace(world_size=1)
    cb.on_step_begin(args, _state(0), None)
    cb.before_forward({"input_ids": torch.ones(2, 4, dtype=torch.long)})
    cb.on_step_end(args, _state(1), None)
    out = cb.collect(args, _state(1), {"loss": 0.0})
    assert "tokens/non_padding_per_s" not in out and out["density/embed"] == 1.0


def test_run_throughput_is_all_timed_samples_over_all_timed_seconds(monkeypatch):
    """Windows of 1 s for 8 samples and 3 s for 8: the window rates are 8 and 2.67, the run's 4."""
    clock = iter([0.0, 1.0, 10.0, 13.0])
    monkeypatch.setattr("ort_hf.callbacks.density.time.perf_counter", lambda: next(clock))
    cb = InputDensityCallback(skip_steps=0)
    cb.pad_token_id = PAD
    args = SimpleNamespace(world_size=1)
    rates = []
    for step in (1, 2):
        cb.on_step_begin(args, _state(step - 1), None)
        cb.before_forward({"input_ids": torch.ones(8, 4, dtype=torch.long)})
        cb.on_step_end(args, _state(step), None)
        out = cb.collect(args, _state(step), {"loss": 0.0})
        rates.append((out["throughput/samples_per_s"], out["throughput/run_samples_per_s"]))
    assert rates == [(8.0, 8.0), (round(8 / 3, 3), 4.0)]
