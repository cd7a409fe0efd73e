"""`ort-hf bench` on users' own inputs: classification tables as users have them (GLUE's MRPC
layout: a sentence pair, the label in "Quality"; string labels; more than two classes), tables and
model folders the bench cannot use (a clear error before any worker starts), sequences longer
than the model's positions or a model that cannot run a workload (the workload is skipped and
says what to pass)."""

import csv

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from ort_hf.bench.data import build_dataset, collator_for, num_labels
from ort_hf.bench.models import build_model
from ort_hf.bench.sources import data_file, length_problem, model_config, model_problem
from ort_hf.bench.spec import WORKLOADS, BenchSettings
from ort_hf.bench.tables import BadTable, read_table
from ort_hf.bench.worker import _reason
from ort_hf.cli import main

MRPC_HEADER = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
PAIRS = [
    ("1", "702876", "702977", "He said the film was good .", "The film was good , he said ."),
    ("0", "2108705", "2108831", "Prices rose in May .", "The team won on Sunday ."),
    ("1", "1330381", "1330521", "It rained all day .", "Rain fell the whole day ."),
]


def _write(path, rows, delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(
            f, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL, escapechar="\\"
        ).writerows(rows)
    return path


def test_mrpc_layout_reads_the_pair_and_the_quality_label(tmp_path, tiny_model_dir):
    train = _write(tmp_path / "train.tsv", [MRPC_HEADER, *PAIRS], delimiter="\t")
    table = read_table(train)
    assert table.texts == ([p[3] for p in PAIRS], [p[4] for p in PAIRS])
    assert table.labels == [1, 0, 1]  # Quality, not the "#1 ID" column next to it

    settings = BenchSettings(
        steps=2, warmup_steps=1, batch_size=3, seq_len=48, model_dir=str(tiny_model_dir), train_file=str(train)
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = build_dataset(WORKLOADS["sst2-dynamic"], settings, tokenizer)
    first = dataset[0]
    assert first["labels"] == 1
    assert tokenizer.decode(first["input_ids"]) == tokenizer.decode(tokenizer(PAIRS[0][3], PAIRS[0][4])["input_ids"])
    assert 1 in first["token_type_ids"]  # encoded as a pair: the second sentence is segment 1


def test_string_labels_and_three_classes_size_the_head(tmp_path, tiny_model_dir):
    rows = [
        ("premise", "hypothesis", "label"),
        ("a man sleeps", "a person rests", "entailment"),
        ("a man sleeps", "a man runs", "contradiction"),
        ("a man sleeps", "he is tired", "neutral"),
        ("a dog barks", "an animal makes noise", "entailment"),
    ]
    train = _write(tmp_path / "nli.csv", rows)
    settings = BenchSettings(
        steps=1, warmup_steps=1, batch_size=2, seq_len=32, model_dir=str(tiny_model_dir), train_file=str(train)
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    workload = WORKLOADS["sst2-dynamic"]
    dataset = build_dataset(workload, settings, tokenizer)
    assert num_labels(dataset) == 3
    assert list(dataset["labels"]) == [1, 0, 2, 1]  # sorted class names: contradiction 0, entailment 1, neutral 2
    assert dataset.features["labels"].names == ["contradiction", "entailment", "neutral"]

    # The 2-label checkpoint gets a 3-way head, and a batch trains through it.
    model = build_model(workload, settings, tokenizer, num_labels=num_labels(dataset))
    assert model.classifier.out_features == 3
    batch = collator_for(workload, tokenizer)([dataset[i] for i in range(2)])
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_json_lines_as_datasets_writes_them(tmp_path, tiny_model_dir):
    from datasets import Dataset

    train = tmp_path / "train.jsonl"
    Dataset.from_dict(
        {"label": [0.0, 1.0, 1.0], "sentence": ["dull", "a clever plot", "wonderful"], "idx": [0, 1, 2]}
    ).to_json(train)
    table = read_table(train)
    assert table.texts == (["dull", "a clever plot", "wonderful"],)
    assert table.labels == [0, 1, 1]  # whole numbers from a float column are class ids

    settings = BenchSettings(
        steps=1, warmup_steps=1, batch_size=2, seq_len=32, model_dir=str(tiny_model_dir), train_file=str(train)
    )
    assert data_file(WORKLOADS["sst2-dynamic"], settings) == train
    dataset = build_dataset(WORKLOADS["sst2-dynamic"], settings, AutoTokenizer.from_pretrained(tiny_model_dir))
    assert list(dataset["labels"]) == [0, 1, 1, 0] and num_labels(dataset) == 2  # cycled to 4 rows


def test_a_json_array_is_refused_with_what_to_write(tmp_path):
    train = tmp_path / "train.json"
    train.write_text('[{"sentence": "good", "label": 1}]')
    with pytest.raises(BadTable, match="line 1 is not a JSON object; the bench reads JSON lines"):
        read_table(train)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("review", "label"), ("good", "1")], "cannot tell the text and label columns"),
        ([("sentence1", "sentence2", "score"), ("a", "b", "3.8")], "cannot tell the text and label columns"),
        ([("sentence1", "sentence2", "label"), ("a", "b", "3.8")], "regression target"),
        ([("sentence", "label"), ("a", "-1")], "negative"),
        ([("sentence", "label")], "no complete rows"),
    ],
)
def test_unreadable_tables_say_what_to_change(tmp_path, rows, message):
    train = _write(tmp_path / "t.csv", rows)
    with pytest.raises(BadTable, match=message):
        data_file(WORKLOADS["sst2-padded"], BenchSettings(train_file=str(train)))


def test_bench_stops_on_an_unreadable_table_before_any_worker(tmp_path):
    train = _write(tmp_path / "t.csv", [("review", "stars"), ("good", "5")])
    out = tmp_path / "bench"
    with pytest.raises(SystemExit, match="--train_file: t.csv: cannot tell the text and label columns"):
        main(
            [
                "bench",
                "--out",
                str(out),
                "--workloads",
                "sst2-dynamic",
                "--variants",
                "eager",
                "--train_file",
                str(train),
            ]
        )
    assert not list(out.glob("**/runs"))  # no worker started


def test_bench_stops_on_a_folder_that_is_no_model(tmp_path):
    out = tmp_path / "bench"
    with pytest.raises(SystemExit, match="is not a Hugging Face model folder"):
        main(
            [
                "bench",
                "--out",
                str(out),
                "--workloads",
                "sst2-dynamic",
                "--variants",
                "eager",
                "--model_dir",
                str(tmp_path / "missing"),
            ]
        )
    assert not list(out.glob("**/runs"))


def test_bench_stops_on_a_model_folder_without_its_tokenizer(tiny_model_dir, tmp_path):
    # A Trainer checkpoint saved without a processing_class: config and weights only.
    # transformers would make up an empty tokenizer for it, and every text would become two tokens.
    weights_only = tmp_path / "checkpoint"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (weights_only / name).write_bytes((tiny_model_dir / name).read_bytes())
    out = tmp_path / "bench"
    with pytest.raises(SystemExit, match=r"has no tokenizer files .*\(tokenizer.save_pretrained\)"):
        main(
            [
                "bench",
                "--out",
                str(out),
                "--workloads",
                "sst2-dynamic",
                "--variants",
                "eager",
                "--model_dir",
                str(weights_only),
            ]
        )
    assert not list(out.glob("**/runs"))


def test_sequences_longer_than_the_positions_skip_the_workload(tiny_model_dir, tmp_path, capsys):
    config = model_config(BenchSettings(model_dir=str(tiny_model_dir)))  # 64 positions
    too_long = BenchSettings(model_dir=str(tiny_model_dir), seq_len=128)
    assert "pass --seq_len 64 or less" in length_problem(WORKLOADS["sst2-padded"], too_long, config)
    assert length_problem(WORKLOADS["sst2-padded"], BenchSettings(seq_len=64), config) is None
    assert length_problem(WORKLOADS["clm"], too_long, config) is None  # not a causal LM: clm trains tiny Llama
    roberta = {"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}
    assert "pass --seq_len 512 or less" in length_problem(WORKLOADS["mlm"], BenchSettings(seq_len=513), roberta)
    assert length_problem(WORKLOADS["mlm"], BenchSettings(seq_len=512), roberta) is None

    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--out",
            str(out),
            "--workloads",
            "mlm",
            "--variants",
            "eager",
            "--model_dir",
            str(tiny_model_dir),
            "--seq_len",
            "128",
        ]
    )
    assert code == 1  # nothing ran
    assert (
        "skipping workload mlm: mlm uses 128-token sequences but the model has 64 positions" in capsys.readouterr().out
    )
    assert not list(out.glob("**/runs"))


def test_a_failed_run_keeps_the_whole_message_without_the_resume_hint():
    exc = RuntimeError("ORT failed at step 1: shapes differ\nLast complete checkpoint: none yet (resume ...).")
    assert _reason(exc) == "RuntimeError: ORT failed at step 1: shapes differ"


@pytest.mark.parametrize(
    "flag, value",
    [("--warmup_steps", "0"), ("--steps", "0"), ("--rounds", "0"), ("--batch_size", "0"), ("--threads", "0")],
)
def test_settings_that_measure_nothing_or_the_export_are_refused(flag, value, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--out", str(tmp_path / "bench"), flag, value])
    assert f"argument {flag}: {value} is below" in capsys.readouterr().err
    assert not (tmp_path / "bench").exists()


def test_a_model_that_cannot_run_a_workload_skips_it_and_says_why(tiny_model_dir, tmp_path, capsys):
    # A GPT-2 folder has no masked-LM head; a BERT folder is no causal LM (clm used to train a
    # tiny Llama instead and report it under the user's model).
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)).save_pretrained(gpt2)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(gpt2)
    gpt2_settings = BenchSettings(model_dir=str(gpt2))
    gpt2_config = model_config(gpt2_settings)
    assert "mlm needs a masked LM" in model_problem(WORKLOADS["mlm"], gpt2_settings, gpt2_config)
    assert model_problem(WORKLOADS["clm"], gpt2_settings, gpt2_config) is None
    assert model_problem(WORKLOADS["sst2-dynamic"], gpt2_settings, gpt2_config) is None
    bert_settings = BenchSettings(model_dir=str(tiny_model_dir))
    bert_config = model_config(bert_settings)
    assert "is not a causal LM" in model_problem(WORKLOADS["clm"], bert_settings, bert_config)
    assert model_problem(WORKLOADS["mlm"], bert_settings, bert_config) is None
    assert model_problem(WORKLOADS["clm"], BenchSettings(), {"model_type": "bert"}) is None  # default: tiny Llama

    out = tmp_path / "bench"
    code = main(["bench", "--out", str(out), "--workloads", "mlm", "--variants", "eager", "--model_dir", str(gpt2)])
    assert code == 1  # nothing ran
    assert "skipping workload mlm: mlm needs a masked LM; transformers has none for" in capsys.readouterr().out
    assert not list(out.glob("**/runs"))  # refused before any worker started
