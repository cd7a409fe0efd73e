"""export_onnx writes an inference model that onnxruntime runs with PyTorch's logits."""

import numpy as np
import onnxruntime
import pytest
import torch
from sst2 import read_sst2, sst2_dataset
from transformers import AutoTokenizer, BertForSequenceClassification

from ort_hf.trainer import ORTTrainer, ORTTrainingArguments


def test_exported_minilm_matches_pytorch_on_real_sentences(tmp_path, shared_data, minilm_dir):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    args = ORTTrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        ort_fallback="disable",
        ort_log_level="ERROR",
    )
    trainer = ORTTrainer(
        model=model, args=args, train_dataset=sst2_dataset(shared_data, tok, limit=32), processing_class=tok
    )
    trainer.train()
    path = trainer.export_onnx(str(tmp_path / "onnx"))
    assert (tmp_path / "onnx" / "tokenizer.json").exists() and (tmp_path / "onnx" / "config.json").exists()

    sentences = [s for s, _ in read_sst2(shared_data, split="dev", limit=5)]
    enc = tok(sentences, padding=True, return_tensors="np")  # another batch and length than the export's
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()}
    got = session.run(["logits"], feed)[0]
    model.eval()
    with torch.no_grad():
        expected = model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.numpy()
    assert got.shape == (5, 2)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


HEADS = {
    "BertForQuestionAnswering": ["start_logits", "end_logits"],
    "BertForTokenClassification": ["logits"],
    "BertForMaskedLM": ["logits"],
    "LlamaForCausalLM": ["logits"],
}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_exports_its_outputs_by_name(head, tmp_path):
    import transformers as tf
    from tiny_models import FAMILIES, make_batch

    from ort_hf.engine.export import export_inference_onnx

    family = FAMILIES["llama-clm"] if head.startswith("Llama") else FAMILIES["bert-cls"]
    torch.manual_seed(0)
    model = getattr(tf, head)(family.make_config(0.0, "eager"))
    batch = make_batch("cls", torch.Generator().manual_seed(0))
    batch.pop("labels")
    path = export_inference_onnx(model, batch, tmp_path, check_inputs=[{k: v[:2] for k, v in batch.items()}])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == HEADS[head]
    got = session.run(None, {k: v.numpy() for k, v in batch.items()})
    model.eval()
    with torch.no_grad():
        expected = model(**batch)
    for name, value in zip(HEADS[head], got):
        np.testing.assert_allclose(value, expected[name].numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "head",
    [
        "question-answering",
        "sequence-classification",
        "token-classification",
        "multiple-choice",
        "causal-lm",
        "seq2seq-t5",
    ],
)
def test_default_export_after_each_head_leaves_out_its_label_inputs(head, tmp_path):
    """trainer.export_onnx(dir) with the default sample batch: no label input (labels, start_positions /
    end_positions) reaches the inference model; an encoder-decoder takes the decoder inputs instead."""
    from test_heads import HEADS, _data

    make_model, kind, _ = HEADS[head]
    data = _data(kind)
    trainer = ORTTrainer(
        model=make_model(),
        args=ORTTrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], per_device_eval_batch_size=4),
        train_dataset=data,
    )
    path = trainer.export_onnx(str(tmp_path / "onnx"))  # checks onnxruntime against PyTorch itself
    names = {i.name for i in onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()}
    labels = {"labels", "start_positions", "end_positions"}
    assert names and not names & labels and names <= set(data.column_names) | {"decoder_input_ids"}, names
    assert ("decoder_input_ids" in names) == (kind == "s2s")
