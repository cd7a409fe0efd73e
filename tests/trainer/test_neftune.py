"""NEFTune (neftune_noise_alpha) trains inside the ORT graph, with the Trainer's noise."""

import torch
from tiny_models import FAMILIES, build, id_dataset
from torch import nn
from transformers.integrations.neftune import neftune_post_forward_hook

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments
from ort_hf.trainer.neftune import exportable_neftune_hook


def test_exportable_hook_draws_the_trainers_noise():
    embedding = nn.Embedding(10, 64)
    embedding.neftune_noise_alpha = 5.0
    out = torch.randn(4, 32, 64)
    bound = 5.0 / (32 * 64) ** 0.5
    for hook in (neftune_post_forward_hook, exportable_neftune_hook):
        noise = hook(embedding, None, out) - out
        assert noise.abs().max() <= bound * (1 + 1e-5) and noise.abs().max() > 0.99 * bound
        assert abs(noise.mean()) < 0.05 * bound and abs(noise.abs().mean() - bound / 2) < 0.05 * bound
    embedding.eval()
    assert torch.equal(exportable_neftune_hook(embedding, None, out), out)


def _train(tmp_path, alpha):
    data = id_dataset(16, 12, lambda ids, g: ids, attention_mask=False)
    model = build(FAMILIES["llama-clm"])
    args = ORTTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        neftune_noise_alpha=alpha,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    trainer = ORTTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert trainer.ort_engine_status().backend == "ort"
    return trainer, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_neftune_runs_in_the_ort_graph(tmp_path):
    trainer, noisy = _train(tmp_path / "noisy", 5.0)
    graph = trainer.ort_engine.training_graph().graph
    assert any(node.op_type == "RandomUniformLike" for node in graph.node)
    embeddings = trainer.model.get_input_embeddings()
    assert not embeddings._forward_hooks and not hasattr(embeddings, "neftune_noise_alpha")  # removed after train()
    _, clean = _train(tmp_path / "clean", None)
    assert clean[0] != noisy[0]
