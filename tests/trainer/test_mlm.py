"""MLM through ORTTrainer: label sparsity fires and is reported; gradient accumulation is exact."""

import logging

import pytest
import torch
from mlm_data import tiny_bert_mlm, wikitext_mlm_dataset
from transformers import AutoTokenizer, Trainer, TrainingArguments

from ort_hf.engine.cpu_weight_grad import OPERATOR, large_enough
from ort_hf.engine.options import WEIGHT_GRAD_MIN_DIM
from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def dataset(shared_data, tokenizer):
    return wikitext_mlm_dataset(shared_data, tokenizer)


def _args(cls, out, **kw):
    base = dict(
        output_dir=str(out),
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        report_to=[],
        save_strategy="no",
        optim="adamw_torch",
        disable_tqdm=True,
    )
    base.update(kw)
    if cls is ORTTrainingArguments:
        base.update(ort_fallback="disable", ort_log_level="ERROR")
    return cls(**base)


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_label_sparsity_fires_and_loss_matches_pytorch(dataset, tokenizer, tmp_path, caplog):
    steps = dict(max_steps=8, per_device_train_batch_size=8)
    ref = Trainer(
        model=tiny_bert_mlm(tokenizer.vocab_size),
        args=_args(TrainingArguments, tmp_path / "pt", **steps),
        train_dataset=dataset,
    )
    ref.train()
    with caplog.at_level(logging.WARNING, logger="ort_hf"):
        trainer = ORTTrainer(
            model=tiny_bert_mlm(tokenizer.vocab_size),
            args=_args(ORTTrainingArguments, tmp_path / "ort", **steps),
            train_dataset=dataset,
        )
        trainer.train()
    engine = trainer.ort_engine
    assert engine.engine_status().backend == "ort"
    assert engine.label_sparsity_fired() is True  # read from ORT's graph, not its banner
    # The tied decoder's gradient sums over the labelled rows only: ORT's Gemm, not PyTorch's mm.
    assert "Gemm (weight gradient)" not in engine._record.swapped
    # The labels' gather went past the head into the last layer (opset 16 + BiasGelu export):
    # its feed-forward block runs on the labelled tokens only.
    graph = engine.training_graph().graph
    producers = {out: node for node in graph.node for out in node.output}
    ffn_in = next(n for n in graph.node if n.name.endswith("encoder/layer.1/intermediate/dense/MatMul"))
    assert producers[ffn_in.input[0]].op_type == "ShrunkenGather"
    # The loss's forward runs as LogSoftmax + NegativeLogLikelihoodLoss (engine/cpu_kernel_swaps.py).
    loss_ops = [n.op_type for n in graph.node if "loss_fct" in n.name]
    assert "SoftmaxCrossEntropyLossInternal" not in loss_ops and "NegativeLogLikelihoodLoss" in loss_ops, loss_ops
    said = [r.getMessage() for r in caplog.records if "label sparsity fired" in r.getMessage()]
    assert len(said) == 1, said
    logged = next(h for h in trainer.state.log_history if "ort/label_sparsity" in h)
    assert logged["ort/label_sparsity"] == 1.0 and 0.05 < logged["ort/label_density"] < 0.25
    diffs = [abs(a - b) for a, b in zip(_losses(ref), _losses(trainer))]
    assert len(diffs) == 8 and max(diffs) <= 1e-4 + 1e-9, diffs


@pytest.mark.parametrize(
    "sparsity, products",
    [(True, False), (True, True), (False, False)],
    ids=["label-sparsity", "label-sparsity-products-on", "label-sparsity-off"],
)
def test_weight_gradients_on_mm_except_where_label_sparsity_cut_the_rows(
    dataset, tokenizer, tmp_path, sparsity, products
):
    model = tiny_bert_mlm(tokenizer.vocab_size, hidden_size=WEIGHT_GRAD_MIN_DIM)  # its linears wide enough to move
    trainer = ORTTrainer(
        model=model,
        args=_args(
            ORTTrainingArguments,
            tmp_path,
            max_steps=1,
            per_device_train_batch_size=8,
            ort_enable_label_sparsity=sparsity,
            ort_cpu_linear_product_swap=products,
            ort_cpu_weight_grad_swap=True,  # on every CPU (by default off on AMD's with AVX512)
        ),
        train_dataset=dataset,
    )
    trainer.train()
    engine = trainer.ort_engine
    assert engine.label_sparsity_fired() is sparsity
    linears = [
        name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and large_enough(*m.weight.shape)
    ]
    assert (
        len(linears) == 14
    )  # q, k, v, o and the feed-forward's two in each of 2 layers; the head's transform, decoder
    moved = [n.name for n in engine.training_graph().graph.node if n.name.endswith(OPERATOR.replace("::", "_"))]
    assert engine._record.swapped.get("Gemm (weight gradient)", 0) == len(moved)
    assert any("/layer.0/" in name for name in moved)  # the first layer's rows are every token's
    head = [name for name in moved if "/cls/" in name]
    # with label sparsity the head sums over the labelled rows only: ORT's Gemm, unless PyTorch's
    # products are on (engine/cpu_weight_grad.py)
    assert len(head) == (0 if sparsity and not products else 2), moved
    if not sparsity or products:
        assert len(moved) == len(linears)
    # the tied decoder's gradient on PyTorch's product takes the embeddings' in place (cpu_tied_embedding_grad.py)
    assert engine._record.swapped.get("Sum (tied embedding gradient)", 0) == (0 if sparsity and not products else 1)


def _accumulated_runs(dataset, tokenizer, out, max_steps, hidden_size=64, **ort):
    """Trainer and ORTTrainer (with ``ort`` options) from the same seed, batch 4 x accumulation 2:
    the ORTTrainer, and each run's losses and final weights."""
    runs = {}
    for cls_trainer, cls_args in ((Trainer, TrainingArguments), (ORTTrainer, ORTTrainingArguments)):
        model = tiny_bert_mlm(tokenizer.vocab_size, hidden_size=hidden_size)
        extra = ort if cls_trainer is ORTTrainer else {}
        args = _args(
            cls_args,
            out / cls_trainer.__name__,
            max_steps=max_steps,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            **extra,
        )
        trainer = cls_trainer(model=model, args=args, train_dataset=dataset)
        trainer.train()
        runs[cls_trainer] = (_losses(trainer), {n: p.detach().clone() for n, p in model.named_parameters()})
    return trainer, runs


def _assert_same_training(runs):
    (l1, p1), (l2, p2) = runs[Trainer], runs[ORTTrainer]
    assert max(abs(a - b) for a, b in zip(l1, l2)) <= 1e-4
    for name in p1:
        torch.testing.assert_close(p2[name], p1[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_gradient_accumulation_matches_trainer(dataset, tokenizer, tmp_path):
    """batch 4 x accumulation 2, label counts differing per micro batch: the same steps as Trainer.

    BertForMaskedLM's loss is its batch mean (an inline nn.CrossEntropyLoss that ignores
    num_items_in_batch), so Trainer sums two micro-batch means; ModuleWithLoss's cross-entropy
    must do the same, not a count-weighted mean."""
    trainer, runs = _accumulated_runs(dataset, tokenizer, tmp_path, max_steps=4)
    assert trainer.ort_engine_status().backend == "ort" and trainer._ort_run.loss_module.loss_kind == "cross_entropy"
    micro_counts = [sum(1 for x in row if x != -100) for row in dataset["labels"][:8]]
    assert sum(micro_counts[:4]) != sum(micro_counts[4:]), "micro batches should hold different label counts"
    _assert_same_training(runs)


def test_tied_table_gradient_summed_in_place_trains_as_trainer(dataset, tokenizer, tmp_path):
    """With the head's gradient on PyTorch's product, the tied word embeddings' two gradients are summed
    in place (engine/cpu_tied_embedding_grad.py): over accumulated micro batches, the same weights as
    Trainer's."""
    trainer, runs = _accumulated_runs(
        dataset,
        tokenizer,
        tmp_path,
        max_steps=2,
        hidden_size=WEIGHT_GRAD_MIN_DIM,
        ort_cpu_linear_product_swap=True,
        ort_cpu_weight_grad_swap=True,
    )
    assert trainer.ort_engine._record.swapped.get("Sum (tied embedding gradient)") == 1
    _assert_same_training(runs)
