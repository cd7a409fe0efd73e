"""Benchmark models: the packaged MiniLM (or ``--model_dir``); built in code, a tiny Llama for
clm, a BERT-base-sized classifier and Qwen2-shaped causal LMs with LoRA; and
:class:`MaskedHeadMLM`, the hand-written PyTorch comparison for ORT's label sparsity."""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import ModelOutput

from ..module_with_loss import IGNORE_INDEX
from .sources import is_causal_lm, model_dir
from .spec import LORA_DROPOUT, BenchSettings, Workload


def load_tokenizer(settings: BenchSettings):
    tokenizer = AutoTokenizer.from_pretrained(model_dir(settings))
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # Decoder tokenizers (GPT-2, Llama) have no pad token; padded batches need one. Padding
        # is masked out, so which token it is does not change the loss.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class MaskedHeadMLM(nn.Module):
    """A masked LM with its head (the vocabulary projection) and the loss run on the masked
    positions only: what ORT's label sparsity does, written by hand in PyTorch.

    Works for any transformers masked LM whose head follows ``model.base_model``: a forward hook
    on the base model keeps only the masked rows of its hidden states, so the model's own head
    (BERT's ``cls``, RoBERTa's ``lm_head``, DistilBERT's ``vocab_*``, ALBERT's ``predictions``, ...)
    sees ``[1, masked, hidden]``. Same loss as the model's own (sum over masked positions /
    ``num_items_in_batch``); the decoder weight stays tied to the input embeddings.
    """

    def __init__(self, mlm: nn.Module):
        super().__init__()
        if getattr(mlm, "base_model", mlm) is mlm:
            raise ValueError(f"masked-head needs a masked LM with a base model and a head, not {type(mlm).__name__}")
        self.mlm = mlm
        self.config = mlm.config
        self.loss_fct = nn.CrossEntropyLoss(reduction="sum")
        self._picked: torch.Tensor | None = None
        mlm.base_model.register_forward_hook(self._keep_masked_rows)

    def _keep_masked_rows(self, module, args, output):
        if self._picked is None:
            return output
        hidden = output[0]
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self._picked).unsqueeze(0)
        if isinstance(output, ModelOutput):
            output[next(iter(output.keys()))] = rows
            return output
        return (rows, *output[1:])

    def forward(self, input_ids, labels, attention_mask=None, num_items_in_batch=None, **inputs):
        flat_labels = labels.reshape(-1)
        self._picked = (flat_labels != IGNORE_INDEX).nonzero().squeeze(1)
        try:
            logits = self.mlm(input_ids=input_ids, attention_mask=attention_mask, **inputs).logits
        finally:
            picked, self._picked = self._picked, None
        loss = self.loss_fct(logits.reshape(-1, logits.shape[-1]).float(), flat_labels.index_select(0, picked))
        count = num_items_in_batch if num_items_in_batch is not None else picked.numel()
        return {"loss": loss / count}


def _config(settings: BenchSettings, **overrides):
    return _with_dropout(AutoConfig.from_pretrained(model_dir(settings), **overrides), settings.dropout)


def _with_dropout(config, dropout: float | None):
    """``config`` with every dropout probability set to ``dropout`` (None: the model's own)."""
    if dropout is not None:
        for name, value in vars(config).items():
            if isinstance(value, float) and ("dropout" in name or name.endswith("_pdrop")):
                setattr(config, name, dropout)
    return config


# Qwen2-shaped causal LMs for the LoRA workloads: hidden, layers, heads, kv heads, intermediate
# (with a 30k vocabulary and an untied head, about 55M, 200M and 485M parameters).
QWEN2_SIZES = {"55m": (512, 8, 8, 4, 1408), "200m": (1024, 12, 16, 8, 2816), "485m": (1536, 16, 12, 4, 4224)}


def _qwen2_lora(size: str, vocab_size: int, seq_len: int, dropout: float | None) -> nn.Module:
    import peft

    hidden, layers, heads, kv_heads, intermediate = QWEN2_SIZES[size]
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=seq_len,
        tie_word_embeddings=False,
        use_cache=False,
        pad_token_id=0,
    )
    model = Qwen2ForCausalLM(_with_dropout(config, dropout))
    lora = peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj"],
        lora_dropout=LORA_DROPOUT if dropout is None else dropout,
    )
    return peft.get_peft_model(model, lora)


def _bert_base(vocab_size: int, seq_len: int, dropout: float | None, num_labels: int, pad_token_id) -> nn.Module:
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=max(seq_len, 512),
        num_labels=num_labels,
        pad_token_id=pad_token_id or 0,
    )
    return BertForSequenceClassification(_with_dropout(config, dropout))


GPT2_VOCAB = 50257  # GPT-2's vocabulary: the head's cost; the packaged tokenizer's ids all fall inside it


def _gpt2_4x256(seq_len: int, dropout: float | None) -> nn.Module:
    config = GPT2Config(
        vocab_size=GPT2_VOCAB,
        n_embd=256,
        n_layer=4,
        n_head=4,
        n_positions=max(seq_len, 256),
        use_cache=False,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(_with_dropout(config, dropout))


def _built_in(workload: Workload, settings: BenchSettings, tokenizer, num_labels: int) -> nn.Module:
    seq = settings.seq_for(workload)
    if workload.built_in == "gpt2-4x256":
        return _gpt2_4x256(seq, settings.dropout)
    if workload.built_in == "bert-base":
        return _bert_base(len(tokenizer), seq, settings.dropout, num_labels, tokenizer.pad_token_id)
    return _qwen2_lora(workload.built_in.removeprefix("qwen2-"), len(tokenizer), seq, settings.dropout)


def tiny_llama(vocab_size: int, seq_len: int, dropout: float | None) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(seq_len, 256),
        attention_dropout=dropout or 0.0,
        use_cache=False,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


def build_model(
    workload: Workload, settings: BenchSettings, tokenizer, masked_head: bool = False, num_labels: int = 2
) -> nn.Module:
    """Seeded, so every variant starts from the same weights (new heads included). ``num_labels``
    sizes the classification head (the classes the data names)."""
    torch.manual_seed(settings.seed)
    if workload.built_in:
        return _built_in(workload, settings, tokenizer, num_labels)
    path = model_dir(settings)
    if workload.task == "mlm":
        model = AutoModelForMaskedLM.from_pretrained(path, config=_config(settings))
        return MaskedHeadMLM(model) if masked_head else model
    if workload.task == "cls":
        config = _config(settings, num_labels=num_labels)
        if config.pad_token_id is None:  # decoder classifiers find each row's last token by it
            config.pad_token_id = tokenizer.pad_token_id
        # A checkpoint already fine-tuned on another label set gets a new (seeded) head, as
        # run_glue's --ignore_mismatched_sizes does.
        return AutoModelForSequenceClassification.from_pretrained(path, config=config, ignore_mismatched_sizes=True)
    config = AutoConfig.from_pretrained(path)
    if is_causal_lm(config.architectures):  # a user's own causal LM
        return AutoModelForCausalLM.from_pretrained(path, config=_config(settings, use_cache=False))
    return tiny_llama(len(tokenizer), settings.seq_for(workload), settings.dropout)
