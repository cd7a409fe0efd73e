"""What the sweep runs: the tasks (an Auto mapping each), the ORT modes, and the training run they share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    mapping: str  # a *_MAPPING_NAMES of transformers.models.auto.modeling_auto: model type -> class name
    collator: str  # data.COLLATORS key
    labels: str  # data.rows: "class", "token", "span", "sequence" or "none" (the collator makes them)
    needs: tuple[str, ...] = ()  # special ids the data needs beyond pad (tiny_config.tiny_config)
    num_labels: int | None = None
    # Rows packed as run_clm's group_texts packs them: one length per batch, no padding, every label
    # counted (data.build_rows), instead of ragged rows padded to a multiple.
    packed: bool = False
    modes: tuple[str, ...] = ("default", "raw", "rewrites")  # the MODES this task runs


TASKS = {
    t.name: t
    for t in (
        Task("seq-cls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "padding", "class", num_labels=3),
        Task(
            "token-cls", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification", "token", num_labels=3
        ),
        Task("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal-lm", "none"),
        # Dense labels: the fused chunked LM-head loss runs only there. Nothing is padded, so the
        # padding rewrites have nothing to act on and their mode is not run.
        Task(
            "causal-lm-packed",
            "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            "causal-lm",
            "none",
            packed=True,
            modes=("default", "raw", "chunked_lm_loss"),
        ),
        Task("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked-lm", "none", needs=("mask",)),
        Task(
            "seq2seq-lm",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
            "seq2seq",
            "sequence",
            needs=("decoder_start",),
        ),
        Task("question-answering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "padding", "span"),
    )
}
DEFAULT_TASKS = tuple(TASKS)

# Each mode: the ORTTrainingArguments overrides of one ORT run, on top of the shared arguments and
# EVERY_MODE's.
MODES: dict[str, dict] = {
    # What a user gets, with the pre-flight forced on: a class earns the `exact` list (and skips the
    # pre-flight when shipped) only if ORT also matched PyTorch on the pre-flight's copy of another
    # length and row count, which the sweep's own batches may not reach.
    "default": {"ort_preflight": "always"},
    "raw": {"ort_preflight": "never", "ort_trim_padding": False, "ort_eliminate_padding": False},  # the engine alone
    "rewrites": {"ort_preflight": "never", "ort_trim_padding": True, "ort_eliminate_padding": True},  # forced on
    # The fused chunked LM-head loss forced on (it acts on dense causal-LM labels only), nothing else.
    "chunked_lm_loss": {
        "ort_preflight": "never",
        "ort_trim_padding": False,
        "ort_eliminate_padding": False,
        "ort_chunked_lm_loss": True,
    },
}
EVERY_MODE = {
    "ort_fallback": "disable",  # a mode that quietly trained in PyTorch would prove nothing
    # Every linear weight's gradient moves to PyTorch, as a real-sized model's do (the tiny models'
    # weights are below the default bound, engine/cpu_weight_grad.py).
    "ort_cpu_weight_grad_swap": True,  # on every CPU (by default off on AMD's with AVX512)
    "ort_cpu_weight_grad_min_dim": 1,
    # The layers' forward products and input gradients on PyTorch's matmul, on every CPU and at every
    # size: the default on Intel CPUs for large enough weights (engine/cpu_linear_products.py).
    "ort_cpu_linear_product_swap": True,
    "ort_cpu_linear_product_min_dim": 1,
}


@dataclass(frozen=True)
class RunSettings:
    """The training run both trainers make in every case (docs/architectures.md states these)."""

    steps: int = 4
    batch_size: int = 4
    min_len: int = 5
    max_len: int = 24
    # A packed task's rows are at least this long: after the causal shift, (length - 1) / length of
    # the labels count, at least the 90% above which ORTTrainer computes a dense loss.
    packed_min_len: int = 12
    # The collators pad each batch to a multiple of this, as users' padding to a multiple of 8 or to a
    # max_length does: trailing columns are then padding in every row, the padding trim has something
    # to drop, and a model that reads a padding position shows it.
    pad_to_multiple_of: int = 16
    learning_rate: float = 1e-2
    seed: int = 42

    def training_arguments(self, output_dir: str) -> dict:
        return dict(
            output_dir=output_dir,
            max_steps=self.steps,
            per_device_train_batch_size=self.batch_size,
            optim="sgd",
            learning_rate=self.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            # No clipping: the step-1 gradients compared are the raw ones, and clipping would tie every
            # parameter's update to the global norm.
            max_grad_norm=0.0,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=self.seed,
            data_seed=self.seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
            train_sampling_strategy="sequential",  # both trainers see the same batches in the same order
        )


SETTINGS = RunSettings()


def model_class_name(task: Task, model_type: str) -> str:
    from transformers.models.auto import modeling_auto

    name = getattr(modeling_auto, task.mapping)[model_type]
    return name[0] if isinstance(name, (tuple, list)) else name


def model_types(task: Task) -> list[str]:
    from transformers.models.auto import modeling_auto

    return sorted(getattr(modeling_auto, task.mapping))
