"""What a benchmark run is made of: workloads, variants, and the settings shared by all workers."""

from __future__ import annotations

from dataclasses import asdict, dataclass

BASELINE = "eager"
LORA_DROPOUT = 0.05  # of the LoRA workloads: the value PEFT's and TRL's LoRA examples use; --dropout replaces it


@dataclass(frozen=True)
class Workload:
    name: str
    task: str  # "mlm", "cls", "clm", or "lora" (LoRA on a causal LM, the first half of each row's labels masked)
    seq_len: int
    batch_size: int
    padding: str  # "none" (packed chunks), "max_length" or "dynamic"
    about: str
    built_in: str | None = None  # a model built in code (models._built_in), whatever --model_dir says
    steps: int = 20  # measured steps unless --steps: fewer for the models whose steps take seconds


WORKLOADS = {
    w.name: w
    for w in (
        Workload("mlm", "mlm", 128, 16, "none", "WikiText-2 in 128-token chunks, 15% masking, BertForMaskedLM"),
        Workload("sst2-padded", "cls", 128, 16, "max_length", "SST-2 classification, every row padded to 128"),
        Workload("sst2-dynamic", "cls", 128, 16, "dynamic", "SST-2 classification, padded to the longest row"),
        Workload(
            "clm",
            "clm",
            256,
            8,
            "none",
            "the --model_dir causal LM, else a tiny Llama built in code; 256-token WikiText-2 chunks",
        ),
        Workload(
            "clm-gpt2",
            "clm",
            256,
            8,
            "none",
            "a GPT-2-shaped causal LM (4 x 256, tied embeddings, "
            "GPT-2's 50,257-word vocabulary) built in code; 256-token WikiText-2 chunks (the packaged tokenizer's "
            "ids)",
            built_in="gpt2-4x256",
        ),
        Workload(
            "bert-base",
            "cls",
            128,
            16,
            "dynamic",
            "SST-2 with dynamic padding, a BERT-base-sized classifier (12 x 768) built in code, full fine-tune",
            built_in="bert-base",
        ),
        *(
            Workload(
                f"lora-{size}",
                "lora",
                128,
                4,
                "none",
                f"PEFT LoRA (r=8 on q/v, lora_dropout {LORA_DROPOUT}) on a "
                f"~{size.upper()}-parameter Qwen2 built in code; 128-token WikiText-2 chunks, the first half of "
                "each row's labels masked (a prompt)",
                built_in=f"qwen2-{size}",
                steps=steps,
            )
            for size, steps in (("55m", 20), ("200m", 8), ("485m", 5))
        ),
    )
}


@dataclass(frozen=True)
class Variant:
    name: str
    use_ort: bool
    about: str
    torch_compile: bool = False
    memory_opt_level: int = 0
    tasks: tuple[str, ...] = ("mlm", "cls", "clm", "lora")
    budget: bool = False  # ORTTrainer budget mode with --memory_budget_mb
    trim: bool = False  # PyTorch fed the batches ORT's CPU path runs (trailing all-padding columns dropped)
    paddings: tuple[str, ...] = ("none", "max_length", "dynamic")  # the workload paddings it applies to
    default: bool = True  # part of a plain `ort-hf bench`
    cpu_dropout_kernels: bool = True  # ORTTrainer's ort_cpu_dropout_kernels
    cpu_weight_grad_swap: bool | None = None  # ORTTrainer's ort_cpu_weight_grad_swap
    cpu_linear_product_swap: bool | None = None  # ORTTrainer's ort_cpu_linear_product_swap
    mem_reuse: bool | None = None  # ORTTrainer's ort_enable_mem_reuse
    chunked_lm_loss: bool | None = None  # ORTTrainer's ort_chunked_lm_loss
    cpu_lm_head_forward_swap: bool | None = None  # ORTTrainer's ort_cpu_lm_head_forward_swap
    cpu_flash_attention: bool = True  # ORTTrainer's ort_cpu_flash_attention
    torch_threads_in_graph: int | None = None  # ORTTrainer's ort_torch_threads_in_graph


VARIANTS = {
    v.name: v
    for v in (
        Variant(BASELINE, False, "HF Trainer path in PyTorch, SDPA attention (use_ort=False): the baseline"),
        Variant(
            "compile",
            False,
            "torch.compile (torch_compile=True, use_ort=False)",
            torch_compile=True,
            tasks=("mlm", "cls", "clm"),
        ),
        Variant(
            "eager-trim",
            False,
            "eager fed the batches ORT's CPU path runs (trailing all-padding columns "
            "dropped): the engine's like-for-like baseline on padded data",
            trim=True,
            tasks=("cls",),
            paddings=("max_length",),
        ),
        Variant(
            "masked-head",
            False,
            "PyTorch, LM head and loss on the masked positions only (hand-written)",
            tasks=("mlm",),
        ),
        Variant("ort", True, "ORTTrainer defaults (ORTModule, ModuleWithLoss, label sparsity)"),
        Variant(
            "ort-recompute",
            True,
            "ORTTrainer with ort_memory_opt_level=1 (layer-wise recompute)",
            memory_opt_level=1,
            tasks=("mlm", "cls", "clm"),
        ),
        Variant(
            "ort-recompute2",
            True,
            "ORTTrainer with ort_memory_opt_level=2 (layer-wise plus compromised plans)",
            memory_opt_level=2,
            default=False,
        ),
        Variant(
            "ort-ort-dropout",
            True,
            "ORTTrainer with ORT's own CPU dropout kernels "
            "(ort_cpu_dropout_kernels=False): what ort_hf's dropout kernels save",
            cpu_dropout_kernels=False,
            default=False,
        ),
        Variant(
            "ort-ort-weight-grad",
            True,
            "ORTTrainer with ORT's own Gemm for the linear weights' gradients "
            "(ort_cpu_weight_grad_swap=False): what computing them with PyTorch's mm saves where mm is "
            "the default (not on AMD CPUs with AVX512, whose default this variant is)",
            cpu_weight_grad_swap=False,
            default=False,
        ),
        Variant(
            "ort-ort-linear",
            True,
            "ORTTrainer with ORT's own MatMul for the linear layers' forward products and input gradients "
            "(ort_cpu_linear_product_swap=False): what PyTorch's products save where they are on by default",
            cpu_linear_product_swap=False,
            default=False,
        ),
        Variant(
            "ort-torch-linear",
            True,
            "ORTTrainer with PyTorch's matrix product for the linear layers' forward products and input "
            "gradients (ort_cpu_linear_product_swap=True): what they save where they are off by default",
            cpu_linear_product_swap=True,
            default=False,
        ),
        Variant(
            "ort-chunked",
            True,
            "ORTTrainer with the fused chunked LM-head loss (ort_chunked_lm_loss=True), its forward "
            "product on ORT's MatMul (ort_cpu_lm_head_forward_swap=True)",
            chunked_lm_loss=True,
            cpu_lm_head_forward_swap=True,
            tasks=("clm",),
            default=False,
        ),
        Variant(
            "ort-unfused",
            True,
            "ORTTrainer with the LM head's loss in PyTorch from ORT's logits (ort_chunked_lm_loss=False): "
            "what the fused loss saves where it is on by default",
            chunked_lm_loss=False,
            tasks=("clm",),
            default=False,
        ),
        Variant(
            "ort-chunked-mm",
            True,
            "as ort-chunked with the forward product on PyTorch's mm (ort_cpu_lm_head_forward_swap=False)",
            chunked_lm_loss=True,
            cpu_lm_head_forward_swap=False,
            tasks=("clm",),
            default=False,
        ),
        Variant(
            "ort-no-flash",
            True,
            "ORTTrainer with attention as ORT's decomposition instead of PyTorch's flash-attention kernel "
            "(ort_cpu_flash_attention=False): what the kernel saves; not in the default run",
            cpu_flash_attention=False,
            default=False,
        ),
        Variant(
            "ort-torch-threads",
            True,
            "ORTTrainer with PyTorch's kernels inside ORT's graph on 2 threads instead of 1 "
            "(ort_torch_threads_in_graph=2); not in the default run",
            torch_threads_in_graph=2,
            default=False,
        ),
        Variant(
            "ort-mem-reuse",
            True,
            "ORTTrainer with ORT's session reusing activation buffers without recompute (ort_enable_mem_reuse=True)",
            mem_reuse=True,
            default=False,
        ),
        Variant(
            "ort-budget",
            True,
            "ORTTrainer budget mode (ort_memory_budget_mb=--memory_budget_mb)",
            budget=True,
            default=False,
        ),
    )
}
DEFAULT_VARIANTS = [name for name, v in VARIANTS.items() if v.default]


@dataclass
class BenchSettings:
    """Settings every worker of one invocation shares (``None`` = the workload's default)."""

    steps: int | None = None  # None: the workload's
    warmup_steps: int = 3
    batch_size: int | None = None
    seq_len: int | None = None
    threads: int = 2
    dropout: float | None = None  # None keeps the model's (what users train with); 0 makes loss curves comparable
    learning_rate: float = 1e-4
    seed: int = 0
    model_dir: str | None = None
    train_file: str | None = None
    data_dir: str | None = None
    memory_budget_mb: float | None = None  # for the ort-budget variant

    def steps_for(self, workload: Workload) -> int:
        return self.steps or workload.steps

    def batch_for(self, workload: Workload) -> int:
        return self.batch_size or workload.batch_size

    def seq_for(self, workload: Workload) -> int:
        return self.seq_len or workload.seq_len

    def as_dict(self) -> dict:
        return asdict(self)


def applies(variant: Variant, workload: Workload) -> bool:
    return workload.task in variant.tasks and workload.padding in variant.paddings
