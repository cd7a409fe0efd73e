"""Small training recipes of the kinds Trainer users write, for the ORTTrainer == Trainer checks."""

from __future__ import annotations

import functools

import torch
from datasets import Dataset
from tiny_models import EXTRA_FAMILIES, FAMILIES, VOCAB, build, id_dataset, rule_labels
from torch import nn

FEATURES, CLASSES = 16, 3


class WeightedLossNet(nn.Module):
    """An in-code model whose forward computes its own, class-weighted loss."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, CLASSES))
        self.register_buffer("class_weight", torch.tensor([1.0, 3.0, 0.5]))

    def forward(self, x, labels=None):
        logits = self.body(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": 10 * nn.functional.cross_entropy(logits, labels, weight=self.class_weight), "logits": logits}


class LineFit(nn.Module):
    """y = a * x + b with its MSE loss, as transformers' own Trainer tests write models."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.0))
        self.b = nn.Parameter(torch.tensor(0.0))

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        return (y,) if labels is None else (nn.functional.mse_loss(y, labels), y)


def line_dataset(n: int = 64, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    return Dataset.from_dict(
        {"input_x": x.tolist(), "labels": (2 * x + 3 + 0.1 * torch.randn(n, generator=g)).tolist()}
    )


class ConvBatchNormNet(nn.Module):
    """Conv + BatchNorm: running statistics change in every training forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)  # BatchNorm's shift is the bias
        self.norm = nn.BatchNorm2d(4)
        self.norm_cma = nn.BatchNorm1d(4 * FEATURES, momentum=None)  # cumulative average: needs the count
        self.head = nn.Linear(4 * FEATURES, CLASSES)

    def forward(self, x, labels=None):
        h = torch.relu(self.norm(self.conv(x.view(-1, 1, 4, 4)))).flatten(1)
        logits = self.head(self.norm_cma(h))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class StepCountingNet(nn.Module):
    """Writes a buffer in forward (a step counter) and uses it: a warm-up that scales the logits."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, labels=None):
        if self.training:
            self.steps += 1
        logits = self.linear(x) * torch.clamp(self.steps.float() / 4, max=1.0)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def features_dataset(n: int = 48, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    return Dataset.from_dict({"x": x.tolist(), "labels": labels.tolist()})


def tokens_dataset(n: int = 48, seed: int = 0, regression: bool = False) -> Dataset:
    labels = (lambda ids, g: (ids[:, 0] > 50).float() * 2 - 0.5) if regression else rule_labels
    return id_dataset(n, 16, labels, seed=seed)


def mlm_dataset(n: int = 32, seed: int = 0) -> Dataset:
    def labels(ids, g):
        chosen = torch.rand(ids.shape, generator=g) < 0.3
        chosen[:, 1] = True
        return ids.masked_fill(~chosen, -100)

    return id_dataset(n, 16, labels, seed=seed, attention_mask=False)


def bert_regressor():
    model = build(FAMILIES["bert-cls"])
    model.config.num_labels = 1
    model.classifier = nn.Linear(model.config.hidden_size, 1)
    model.num_labels = 1
    return model


def mlm_with_z_loss():
    """A transformers head whose instance forward adds an auxiliary term (a z-loss on the logits),
    as libraries that wrap a model's forward do: only the first-batch comparison can see it."""
    model = build(FAMILIES["bert-mlm"])
    forward = model.forward

    @functools.wraps(forward)  # keeps the signature the Trainer reads its input columns from
    def with_aux(*args, **kwargs):
        out = forward(*args, **kwargs)
        if out.loss is not None:
            out.loss = out.loss + 1e-2 * out.logits.float().logsumexp(-1).pow(2).mean()
        return out

    model.forward = with_aux
    return model


def focal_loss(outputs, labels, num_items_in_batch=None):
    log_p = nn.functional.log_softmax(outputs["logits"].float(), dim=-1).gather(-1, labels[:, None]).squeeze(-1)
    return (-((1 - log_p.exp()) ** 2) * log_p).mean()


def ragged_dataset(n: int = 48, seed: int = 0) -> Dataset:
    """Rows of 3 to 16 random token ids, for a collator that pads each batch to its longest row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 17, (n,), generator=g)
    return Dataset.from_dict({"input_ids": [torch.randint(3, VOCAB, (int(k),), generator=g).tolist() for k in lengths]})


def pad_right_with_lm_labels(rows: list[dict]) -> dict:
    """What DataCollatorForLanguageModeling(mlm=False) gives: right padding (id 0), labels -100 there."""
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
    mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


# name -> (model factory, dataset factory, extra training arguments, trainer kwargs)
RECIPES = {
    "classification-eval-accumulation": (
        lambda: build(FAMILIES["bert-cls"]),
        tokens_dataset,
        dict(
            gradient_accumulation_steps=2,
            eval_strategy="steps",
            eval_steps=3,
            save_strategy="steps",
            save_steps=3,
            load_best_model_at_end=True,
            metric_for_best_model="eval_loss",
        ),
        {},
    ),
    "in-code-regression-tuple-output": (
        LineFit,
        line_dataset,
        dict(eval_strategy="steps", eval_steps=2, learning_rate=0.1),
        {},
    ),
    "regression": (bert_regressor, lambda: tokens_dataset(regression=True), {}, {}),
    "own-weighted-loss": (WeightedLossNet, features_dataset, dict(eval_strategy="steps", eval_steps=3), {}),
    "auxiliary-loss-term": (mlm_with_z_loss, mlm_dataset, {}, {}),
    "compute-loss-func": (lambda: build(FAMILIES["bert-cls"]), tokens_dataset, {}, dict(compute_loss_func=focal_loss)),
    "batchnorm": (ConvBatchNormNet, features_dataset, dict(eval_strategy="steps", eval_steps=3), {}),
    "buffer-written-in-forward": (StepCountingNet, features_dataset, {}, {}),
    "causal-lm-dynamic-padding": (
        lambda: build(EXTRA_FAMILIES["qwen2-clm"]),
        ragged_dataset,
        {},
        dict(data_collator=pad_right_with_lm_labels),
    ),
}
