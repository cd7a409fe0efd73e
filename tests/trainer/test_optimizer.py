"""--optim adamw_ort_fused on CPU runs torch's fused AdamW and equals adamw_torch step for step."""

import tempfile

import torch
from tiny_models import FAMILIES, build, make_batch

from ort_hf.trainer import ADAMW_ORT_FUSED, ORTTrainer, ORTTrainingArguments


def _args(optim):
    return ORTTrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="ort_hf_optim-"),
        optim=optim,
        learning_rate=1e-3,
        weight_decay=0.01,
        report_to=[],
        use_cpu=True,
    )


def test_cpu_path_is_fused_adamw_with_trainer_groups():
    cls, kwargs = ORTTrainer.get_optimizer_cls_and_kwargs(_args(ADAMW_ORT_FUSED))
    assert cls is torch.optim.AdamW and kwargs["fused"] is True
    model = build(FAMILIES["bert-cls"])
    trainer = ORTTrainer(model=model, args=_args(ADAMW_ORT_FUSED))
    optimizer = trainer.create_optimizer()
    decays = sorted(g["weight_decay"] for g in optimizer.param_groups)
    assert decays == [0.0, 0.01]


def test_cpu_fused_equals_adamw_torch_step_for_step():
    fam = FAMILIES["bert-cls"]
    gen = torch.Generator().manual_seed(0)
    batches = [make_batch(fam.task, gen) for _ in range(10)]
    results = []
    for optim in ("adamw_torch", ADAMW_ORT_FUSED):
        model = build(fam)
        trainer = ORTTrainer(model=model, args=_args(optim))
        optimizer = trainer.create_optimizer()
        losses = []
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    (l_ref, p_ref), (l_fused, p_fused) = results
    assert max(abs(a - b) for a, b in zip(l_ref, l_fused)) <= 1e-6
    for a, b in zip(p_ref, p_fused):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
