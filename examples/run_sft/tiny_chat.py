"""A chat model built in code, offline: a tokenizer with a ChatML template (assistant turns inside
``{% generation %}`` markers, for TRL's ``assistant_only_loss``) and a small Qwen2 or Llama sized to it.

No hub download. The tokenizer is byte-level (every byte a token, 256 of them) or takes the
vocabulary of a local ``tokenizer.json`` (the packaged MiniLM's: 30,522 WordPiece tokens, a
realistic LM-head width), plus three ChatML special tokens.
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


def build_model(
    tokenizer, hidden_size: int = 32, layers: int = 2, seed: int = 0, family: str = "qwen2"
) -> transformers.PreTrainedModel:
    """A small causal LM (``qwen2`` or ``llama``) for ``tokenizer``, from ``seed``, without dropout."""
    config_cls, model_cls = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[family]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return model_cls(config)
