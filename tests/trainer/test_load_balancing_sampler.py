"""--ort_load_balancing_sampler: ORT's sampler feeds the train dataloader, every sample once."""

import torch
from datasets import Dataset
from tiny_models import FAMILIES, build
from transformers import TrainerCallback

from ort_hf.engine.sampler import LoadBalancingBatchSampler
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def _ragged(n=48):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 17, (n,), generator=gen).tolist()
    ids = [[5 + i % 50] * n_tok + [0] * (16 - n_tok) for i, n_tok in enumerate(lengths)]
    mask = [[1] * n_tok + [0] * (16 - n_tok) for n_tok in lengths]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": mask, "labels": [i % 2 for i in range(n)]}), lengths


def test_two_ranks_get_balanced_batches_covering_every_sample():
    data, lengths = _ragged()
    ranks = [list(LoadBalancingBatchSampler(data, batch_size=4, world_size=2, rank=r, seed=0)) for r in (0, 1)]
    assert sorted(i for batches in ranks for b in batches for i in b) == list(range(len(data)))
    for b0, b1 in zip(*ranks):  # same step on both ranks: similar work (non-padding tokens)
        work0, work1 = sum(lengths[i] for i in b0), sum(lengths[i] for i in b1)
        assert abs(work0 - work1) <= max(lengths), (work0, work1)


def test_trainer_uses_it(tmp_path):
    data, _ = _ragged()
    seen = []

    class Batches(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(state.global_step)

    args = ORTTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
        ort_load_balancing_sampler=True,
    )
    trainer = ORTTrainer(model=build(FAMILIES["bert-cls"]), args=args, train_dataset=data, callbacks=[Batches()])
    loader = trainer.get_train_dataloader()
    assert isinstance(getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler), LoadBalancingBatchSampler)
    trainer.train()
    assert seen == list(range(1, 7)) and trainer.ort_engine_status().backend == "ort"
