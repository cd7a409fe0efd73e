"""A chat model built in code, offline: a tokenizer with a ChatML template (assistant turns inside
``{% generation %}`` markers, for TRL's ``assistant_only_loss``) and a small causal LM sized to it (Qwen2
by default; :func:`families` lists the others).

For the SFT and GRPO examples, the tests and scripts/trl_family_matrix.py; no hub download. The
tokenizer is byte-level (every byte a token, 256 of them) or takes the vocabulary of a local
``tokenizer.json`` (the packaged MiniLM's: 30,522 WordPiece tokens, a realistic LM-head width), plus
three ChatML special tokens.
"""

from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>' + '\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def build_tokenizer(vocabulary_from: str | None = None) -> transformers.PreTrainedTokenizerFast:
    """A tokenizer with the ChatML template above (pad and eos are ChatML's): byte-level (vocabulary
    259), or with the vocabulary of the ``tokenizer.json`` file ``vocabulary_from`` (its special-token
    wrapping such as BERT's [CLS] ... [SEP] left out, so a prompt's tokens prefix its completion's)."""
    specials = [PAD, IM_START, IM_END]
    if vocabulary_from:
        tokenizer = Tokenizer.from_file(str(vocabulary_from))
        tokenizer.post_processor = None
    else:
        vocab = {token: i for i, token in enumerate(specials + list(bytes_to_unicode().values()))}
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=IM_END, chat_template=CHAT_TEMPLATE
    )


def families() -> dict[str, tuple]:
    """name -> (config class, causal-LM class, sequence-classification class or None, config options,
    LoRA target modules): causal-LM families transformers ships, each with the quirk it brings."""
    import transformers as t

    return {
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, t.Qwen2ForSequenceClassification, {}, ["q_proj", "v_proj"]),
        "llama": (t.LlamaConfig, t.LlamaForCausalLM, t.LlamaForSequenceClassification, {}, ["q_proj", "v_proj"]),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, None, {"head_dim": None}, ["q_proj", "v_proj"]),  # q/k norms
        # a sliding window shorter than the sequences
        "mistral": (t.MistralConfig, t.MistralForCausalLM, None, {"sliding_window": 4}, ["q_proj", "v_proj"]),
        "phi3": (t.Phi3Config, t.Phi3ForCausalLM, None, {}, ["qkv_proj", "o_proj"]),  # fused q/k/v projection
        "gemma": (t.GemmaConfig, t.GemmaForCausalLM, None, {"head_dim": None}, ["q_proj", "v_proj"]),  # tied
        # tied embeddings, attention and final-logit soft-capping, a sliding window on alternate layers
        "gemma2": (
            t.Gemma2Config,
            t.Gemma2ForCausalLM,
            t.Gemma2ForSequenceClassification,
            {"head_dim": None, "sliding_window": 4, "query_pre_attn_scalar": None},
            ["q_proj", "v_proj"],
        ),
        # Conv1D projections (LoRA with fan_in_fan_out), tied embeddings, learned positions
        "gpt2": (t.GPT2Config, t.GPT2LMHeadModel, t.GPT2ForSequenceClassification, {}, ["c_attn"]),
        "smollm3": (t.SmolLM3Config, t.SmolLM3ForCausalLM, None, {}, ["q_proj", "v_proj"]),  # layers without RoPE
        "olmo2": (t.Olmo2Config, t.Olmo2ForCausalLM, None, {}, ["q_proj", "v_proj"]),  # q/k norms after projection
    }


def build_model(
    tokenizer,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
    family: str = "qwen2",
    seq_cls: bool = False,
    initializer_range: float = 0.02,
) -> transformers.PreTrainedModel:
    """A small causal LM of ``family`` (:func:`families`) for ``tokenizer``, from ``seed``, without
    dropout; with ``seq_cls``, the family's sequence-classification model (one score per row)."""
    config_cls, lm_cls, cls_cls, options, _ = families()[family]
    heads = 4
    # options given as None are the per-head width (Qwen3's and Gemma's defaults are sized for large models)
    options = {k: hidden_size // heads if v is None else v for k, v in options.items()}
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    if config_cls is transformers.GPT2Config:
        sizes = dict(n_embd=hidden_size, n_layer=layers, n_head=heads, n_positions=512)
        sizes.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0)
    else:
        sizes = dict(
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
    config = config_cls(vocab_size=len(tokenizer), initializer_range=initializer_range, **sizes, **ids, **options)
    if seq_cls:
        config.num_labels = 1
    torch.manual_seed(seed)
    return (cls_cls if seq_cls else lm_cls)(config)


def lora_targets(family: str) -> list[str]:
    """The attention projections LoRA adapts in ``family`` (GPT-2's Conv1D needs ``fan_in_fan_out=True``)."""
    return families()[family][4]


def comparison_args(out, lora: bool, steps: int, **extra) -> dict:
    """Training arguments of a tiny CPU run comparing a TRL trainer with its ORT counterpart (the
    tests' and scripts/trl_family_matrix.py's): one log per step, nothing saved or reported."""
    # bf16 and gradient checkpointing off in both runs: TRL turns them on by default, and the plain
    # trainer would then train in bf16 on CPU, which ORT refuses.
    return dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        seed=0,
        learning_rate=1e-2 if lora else 1e-3,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        **extra,
    )
