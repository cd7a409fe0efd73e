#!/usr/bin/env python
"""Fine-tune a sequence classifier on a GLUE task, or on your own CSV/JSON, with ORTTrainer.

The arguments and behaviour of Hugging Face's ``run_glue`` example, training through ONNX
Runtime (``--use_ort false`` for plain PyTorch). Data comes from ``--data_dir`` (a GLUE task
folder of TSVs, read offline), the hub (``--task_name`` alone, or ``--dataset_name``), or
``--train_file``/``--validation_file``. Extras: ``--compare`` runs the same command through
ORT and through PyTorch and prints both run summaries side by side; ``--export_onnx DIR``
writes an inference ONNX model after training. See README.md next to this file.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # glue_data / glue_metric live next to this script

from glue_data import GLUE_TASKS, GlueTask, read_glue_split, tsv_path  # noqa: E402
from glue_metric import LocalGlueMetric  # noqa: E402

from ort_hf.report.summary import format_summary, run_compare, run_summary, write_summary  # noqa: E402

logger = logging.getLogger("run_glue")


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune (hub names or local folders)."""

    model_name_or_path: str = field(metadata={"help": "Hub model id or a local folder (offline: a folder)."})
    config_name: str | None = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloads from the hub are cached."})
    use_fast_tokenizer: bool = field(
        default=True,
        metadata={"help": "Kept for HF run_glue compatibility; transformers 5 always loads the fast tokenizer."},
    )
    model_revision: str = field(default="main", metadata={"help": "Model version: branch, tag or commit id."})
    token: str | None = field(
        default=None, metadata={"help": "Hub token for private models (default: the logged-in one)."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow model code from the hub repository."})
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Config values to override, e.g. 'hidden_dropout_prob=0,attention_probs_dropout_prob=0' "
            "(dropout off: ORT and PyTorch draw different dropout masks, so only then do their runs "
            "compute the same function)."
        },
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a checkpoint whose classifier head has another number of labels."}
    )
    export_onnx: str | None = field(
        default=None,
        metadata={"help": "After training, write an inference ONNX model (plus config and tokenizer) to this folder."},
    )


@dataclass
class DataTrainingArguments:
    """Which data to train and evaluate on, and how to tokenize it."""

    task_name: str | None = field(default=None, metadata={"help": f"GLUE task: one of {', '.join(GLUE_TASKS)}."})
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "A GLUE task folder as GLUE distributes it (train.tsv, dev.tsv / dev_matched.tsv, "
            "test.tsv), read offline; needs --task_name."
        },
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "A hub dataset (default for GLUE tasks: nyu-mll/glue)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The hub dataset's configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Training data, CSV or JSON."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, CSV or JSON."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data, CSV or JSON."})
    max_seq_length: int = field(default=128, metadata={"help": "Longer inputs are truncated to this many tokens."})
    pad_to_max_length: bool = field(
        default=True,
        metadata={
            "help": "Pad every input to max_seq_length; false pads each batch to its longest input "
            "(DataCollatorWithPadding), which is faster on CPU."
        },
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Re-run tokenization instead of using the cache."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N examples only."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N examples only."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Predict on the first N examples only."})

    def __post_init__(self):
        if self.task_name is not None:
            self.task_name = self.task_name.lower()
            if self.task_name not in GLUE_TASKS:
                raise ValueError(
                    f"--task_name {self.task_name!r} is not a GLUE task: use one of {', '.join(GLUE_TASKS)}."
                )
        if self.data_dir is not None and self.task_name is None:
            raise ValueError("--data_dir reads GLUE TSVs, whose layout depends on the task: add --task_name.")
        if (
            self.task_name is None
            and self.dataset_name is None
            and self.train_file is None
            and self.validation_file is None
        ):
            raise ValueError(
                "Give data: --task_name (with --data_dir offline), --dataset_name, or --train_file/--validation_file."
            )
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1] not in ("csv", "json", "jsonl"):
                raise ValueError(f"--{name} must be a .csv or .json/.jsonl file, got {path}.")


# --- data ----------------------------------------------------------------------------------
def load_raw_datasets(data_args: DataTrainingArguments, model_args: ModelArguments, training_args):
    """A DatasetDict with the hub's split and column names, whatever the source."""
    from datasets import Dataset, DatasetDict, load_dataset

    task = GLUE_TASKS.get(data_args.task_name)
    if data_args.data_dir is not None:
        splits = {}
        wanted = [("train", training_args.do_train, True)]
        wanted += [(s, training_args.do_eval, True) for s in task.dev_splits]
        tests = ("test_matched", "test_mismatched") if data_args.task_name == "mnli" else ("test",)
        wanted += [(s, training_args.do_predict, False) for s in tests]
        for split, needed, with_labels in wanted:
            path = tsv_path(data_args.data_dir, split)
            if needed and not path.exists():
                raise FileNotFoundError(
                    f"{path} not found: --data_dir must be a GLUE task folder ({data_args.task_name})."
                )
            if needed:
                splits[split] = Dataset.from_dict(read_glue_split(task, path, with_labels=with_labels))
        return DatasetDict(splits)
    if data_args.train_file or data_args.validation_file or data_args.test_file:
        files = {
            s: f
            for s, f in (
                ("train", data_args.train_file),
                ("validation", data_args.validation_file),
                ("test", data_args.test_file),
            )
            if f
        }
        kind = "csv" if next(iter(files.values())).endswith(".csv") else "json"
        return load_dataset(kind, data_files=files, cache_dir=model_args.cache_dir, token=model_args.token)
    name = data_args.dataset_name or "nyu-mll/glue"
    config = data_args.dataset_config_name or data_args.task_name
    try:
        return load_dataset(name, config, cache_dir=model_args.cache_dir, token=model_args.token)
    except Exception as exc:  # offline, or a typo: say how to run without the hub
        raise RuntimeError(
            f"could not load the hub dataset {name}/{config} ({type(exc).__name__}: {exc}). Without hub access, "
            "pass --data_dir with the task's GLUE TSVs, or --train_file/--validation_file."
        ) from exc


def label_setup(raw, task: GlueTask | None):
    """(is_regression, label names) of the task, or inferred from the training file's labels."""
    if task is not None:
        return task.is_regression, list(task.label_names or [])
    labelled = raw["train"] if "train" in raw else next(iter(raw.values()))
    if labelled.features["label"].dtype in ("float32", "float64"):
        return True, []
    return False, sorted(set(labelled.unique("label")))


def text_keys(raw, task: GlueTask | None) -> tuple[str, ...]:
    if task is not None:
        return task.keys
    columns = [c for c in next(iter(raw.values())).column_names if c != "label"]
    if "sentence1" in columns and "sentence2" in columns:
        return ("sentence1", "sentence2")
    return tuple(columns[:2]) if len(columns) >= 2 else tuple(columns[:1])


def align_labels(model, label_list: list, task: GlueTask | None) -> dict | None:
    """Label -> id the model is trained with, also written to its config. A checkpoint already
    fine-tuned on the same label names keeps its ids; otherwise ids follow ``label_list``.
    For GLUE tasks the data holds ids already: the map is None when they need no change."""
    default = {f"LABEL_{i}": i for i in range(model.config.num_labels)}
    fine_tuned = bool(model.config.label2id) and model.config.label2id != default
    model_ids = {str(k).lower(): v for k, v in (model.config.label2id or {}).items()}
    names = [str(label).lower() for label in label_list]
    if fine_tuned and sorted(model_ids) == sorted(names):
        ids = [model_ids[n] for n in names]
    else:
        if fine_tuned:
            logger.warning(
                "The model's labels %s are not the data's %s: they are ignored.",
                sorted(model.config.label2id),
                label_list,
            )
        ids = list(range(len(label_list)))
    model.config.label2id = {str(label): i for label, i in zip(label_list, ids)}
    model.config.id2label = {i: str(label) for label, i in zip(label_list, ids)}
    if task is None:
        return dict(zip(label_list, ids))  # raw labels (strings or numbers) -> ids
    return None if ids == list(range(len(ids))) else dict(enumerate(ids))  # dataset ids -> model ids


def tokenize(raw, tokenizer, keys, label_to_id, data_args, training_args):
    padding = "max_length" if data_args.pad_to_max_length else False
    if data_args.max_seq_length > tokenizer.model_max_length:
        logger.warning(
            "--max_seq_length %d is longer than the model's %d: using %d.",
            data_args.max_seq_length,
            tokenizer.model_max_length,
            tokenizer.model_max_length,
        )
    max_length = min(data_args.max_seq_length, tokenizer.model_max_length)

    def preprocess(examples):
        result = tokenizer(*(examples[k] for k in keys), padding=padding, max_length=max_length, truncation=True)
        if label_to_id is not None and "label" in examples:
            result["label"] = [label_to_id[label] if label != -1 else -1 for label in examples["label"]]
        return result

    from datasets import DatasetDict

    with training_args.main_process_first(desc="dataset map pre-processing"):
        return DatasetDict(
            {
                split: dataset.map(
                    preprocess,
                    batched=True,
                    num_proc=data_args.preprocessing_num_workers,
                    load_from_cache_file=not data_args.overwrite_cache,
                    remove_columns=[
                        c for c in dataset.column_names if c != "label"
                    ],  # splits may differ (test: no label)
                    desc=f"Tokenizing {split}",
                )
                for split, dataset in raw.items()
            }
        )


def first(dataset, limit: int | None):
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


# --- metric --------------------------------------------------------------------------------
def load_glue_metric(task_name: str, cache_dir: str | None = None):
    """``evaluate.load("glue", task)`` when it can load (hub, or its module cache when offline);
    otherwise the same formulas from glue_metric.py, said in one log line."""
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    if offline:
        # evaluate has its own offline flag; without it, it retries the hub before trying its cache.
        os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    try:
        import evaluate

        if offline:
            evaluate.config.HF_EVALUATE_OFFLINE = True  # in case evaluate was imported before the env was set
        metric = evaluate.load("glue", task_name, cache_dir=cache_dir)
    except Exception as exc:  # any failure to load means: score locally, with the same formulas
        if offline and isinstance(exc, FileNotFoundError):
            reason = "the hub is offline and evaluate's module cache has no glue"
        else:
            reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        logger.warning(
            "GLUE metric: evaluate.load('glue', %r) failed (%s); scoring with glue_metric.py, the same formulas.",
            task_name,
            reason,
        )
        return LocalGlueMetric(task_name)
    logger.info("GLUE metric: evaluate.load('glue', %r)", task_name)
    return metric


def make_compute_metrics(task_name: str | None, is_regression: bool, cache_dir: str | None):
    import numpy as np

    metric = load_glue_metric(task_name, cache_dir) if task_name else None

    def compute_metrics(p):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        preds = np.squeeze(preds) if is_regression else np.argmax(preds, axis=1)
        if metric is not None:
            result = dict(metric.compute(predictions=preds, references=p.label_ids))
            if len(result) > 1:
                result["combined_score"] = float(np.mean(list(result.values())))
            return result
        # Your own data: HF run_glue's evaluate "mse" / "accuracy", written out.
        if is_regression:
            return {"mse": float(((preds - p.label_ids) ** 2).mean())}
        return {"accuracy": float((preds == p.label_ids).mean())}

    return compute_metrics


def main_metric(task: GlueTask | None, is_regression: bool) -> str:
    if task is not None:
        return f"eval_{task.metric}"
    return "eval_mse" if is_regression else "eval_accuracy"


# --- main ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--compare" in argv:
        argv.remove("--compare")
        return run_compare(str(Path(__file__).resolve()), argv)
    # Imported here, not at the top, so the parent of a --compare run stays a light process.
    import datasets
    import transformers
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        HfArgumentParser,
        default_data_collator,
        set_seed,
    )

    from ort_hf.trainer import ORTTrainer, ORTTrainingArguments

    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, ORTTrainingArguments))
    if len(argv) == 1 and argv[0].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    for name in ("run_glue", "glue_data"):
        logging.getLogger(name).setLevel(logging.INFO if training_args.should_log else log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    engine = {True: "ORT", False: "PyTorch", "auto": "ORT, then the faster engine (--use_ort auto)"}[
        training_args.use_ort
    ]
    logger.info("engine: %s; %s", engine, training_args.output_dir)
    if not training_args.do_train:
        # As in HF run_glue, nothing trains without --do_train (--eval_strategy alone turns on do_eval).
        logger.warning(
            "no --do_train: nothing is trained%s.",
            ", the model is evaluated as loaded" if training_args.do_eval else "",
        )

    set_seed(training_args.seed)  # before the model: the new classifier head is the same for every engine
    task = GLUE_TASKS.get(data_args.task_name)
    raw = load_raw_datasets(data_args, model_args, training_args)
    is_regression, label_list = label_setup(raw, task)
    num_labels = 1 if is_regression else len(label_list)

    hub = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }
    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path,
        num_labels=num_labels,
        finetuning_task=data_args.task_name,
        **hub,
    )
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
        logger.info("config overrides: %s", model_args.config_overrides)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer, **hub
    )
    model = AutoModelForSequenceClassification.from_pretrained(
        model_args.model_name_or_path, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **hub
    )
    label_to_id = None if is_regression else align_labels(model, label_list, task)
    # The first N examples are selected before tokenizing (same result as after; much faster on SST-2).
    limits = {
        "train": data_args.max_train_samples,
        "test": data_args.max_predict_samples,
        "test_matched": data_args.max_predict_samples,
        "test_mismatched": data_args.max_predict_samples,
    }
    raw = datasets.DatasetDict({s: first(d, limits.get(s, data_args.max_eval_samples)) for s, d in raw.items()})
    encoded = tokenize(raw, tokenizer, text_keys(raw, task), label_to_id, data_args, training_args)

    dev_splits = task.dev_splits if task and task.dev_splits[0] in encoded else ("validation",)  # files: "validation"
    eval_splits = dev_splits if training_args.do_eval else ()
    for split in ("train",) * training_args.do_train + eval_splits:
        if split not in encoded:
            raise ValueError(
                f"--do_{'train' if split == 'train' else 'eval'} needs a {split} split; the data has {list(encoded)}."
            )
    train_dataset = encoded["train"] if training_args.do_train else None
    eval_datasets = {s: encoded[s] for s in eval_splits}

    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:  # dynamic padding; multiples of 8 keep fp16/bf16 matmuls on tensor-core shapes
        multiple = 8 if (training_args.fp16 or training_args.bf16) else None
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)

    trainer = ORTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=next(iter(eval_datasets.values()), None),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=make_compute_metrics(data_args.task_name, is_regression, model_args.cache_dir),
    )

    train_metrics, eval_metrics = {}, {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        train_metrics = dict(train_result.metrics, train_samples=len(train_dataset))
        trainer.save_model()
        trainer.log_metrics("train", train_metrics)
        trainer.save_metrics("train", train_metrics)
        trainer.save_state()  # trainer_state.json: what `ort-hf report OUTPUT_DIR` reads
        if model_args.export_onnx:
            path = trainer.export_onnx(model_args.export_onnx)
            logger.info("ONNX inference model written to %s (checked against PyTorch's logits)", path)

    for split, dataset in eval_datasets.items():
        suffix = "_mm" if split == "validation_mismatched" else ""  # HF run_glue's MNLI-mismatched keys
        metrics = trainer.evaluate(eval_dataset=dataset)
        metrics = {f"{k}{suffix}": v for k, v in metrics.items()}
        metrics[f"eval_samples{suffix}"] = len(dataset)
        trainer.log_metrics(f"eval{suffix}", metrics)
        trainer.save_metrics(f"eval{suffix}", metrics)
        eval_metrics.update(metrics)

    if training_args.do_predict:
        predict(trainer, encoded, data_args, is_regression, training_args.output_dir)

    if training_args.do_train:
        summary = run_summary(trainer, train_metrics, eval_metrics, main_metric(task, is_regression))
        write_summary(summary, training_args.output_dir)
        print(format_summary(summary), flush=True)
    return 0


def predict(trainer, encoded, data_args, is_regression, output_dir) -> None:
    """predict_results_<task>[_mm].txt per test split (index, prediction), as HF run_glue writes them."""
    import numpy as np

    splits = [s for s in ("test", "test_matched", "test_mismatched") if s in encoded]
    if not splits:
        raise ValueError(f"--do_predict needs a test split (test.tsv, or --test_file); the data has {list(encoded)}.")
    id2label = trainer.model.config.id2label
    for split in splits:
        dataset = encoded[split]
        if "label" in dataset.column_names:
            dataset = dataset.remove_columns("label")  # test labels are -1 placeholders
        preds = trainer.predict(dataset, metric_key_prefix="predict").predictions
        preds = preds[0] if isinstance(preds, tuple) else preds
        preds = np.squeeze(preds) if is_regression else np.argmax(preds, axis=1)
        name = f"predict_results_{data_args.task_name or 'custom'}{'_mm' if split == 'test_mismatched' else ''}.txt"
        if trainer.is_world_process_zero():
            with open(Path(output_dir) / name, "w") as f:
                f.write("index\tprediction\n")
                for i, p in enumerate(np.atleast_1d(preds)):
                    f.write(f"{i}\t{p:.3f}\n" if is_regression else f"{i}\t{id2label[int(p)]}\n")


if __name__ == "__main__":
    sys.exit(main())
