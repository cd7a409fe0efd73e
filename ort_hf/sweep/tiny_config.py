"""The tiny config of a model type: the type's own defaults with its size attributes shrunk.

Every rule is a row of a table below, keyed by attribute name, so that a type the sweep cannot
shrink is fixed by adding a row, not a branch. A rule applies only where the type's default has
the attribute (nothing is added) and, for sizes, only where the default is larger (nothing grows).
Sub-configs (``text_config``, ``encoder``, ``decoder``, ...) are shrunk by the same rules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS = 64, 4, 16, 128, 2
VOCAB = 256  # ids >= VOCAB that a config names (gpt2's eos 50256) are moved below it: _TokenIds
POSITIONS = 128  # rows are at most 24 tokens; 128 leaves room for position offsets (RoBERTa's pad + 1)
WINDOW = 16  # below the longest row, so sliding / local attention is exercised, not a no-op
EXPERTS, EXPERTS_PER_TOKEN = 4, 2

# Attribute -> its tiny value, where the type's default is an int above it.
TINY_SIZES: dict[str, int] = {
    # width of the residual stream
    **dict.fromkeys(
        (
            "hidden_size",
            "d_model",
            "n_embd",
            "dim",
            "emb_dim",
            "embed_dim",
            "word_embed_proj_dim",
            "true_hidden_size",
            "intra_bottleneck_size",
            "pooler_hidden_size",
            "attention_hidden_size",
            "lru_width",
            "d_latents",
            "hidden_size_per_layer_input",
        ),
        HIDDEN,
    ),
    # factorised embeddings (ALBERT, ELECTRA, RemBERT) stay narrower than the model, as in the originals
    **dict.fromkeys(("embedding_size", "input_embedding_size", "output_embedding_size", "entity_emb_size"), 32),
    # depth
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "n_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
        ),
        LAYERS,
    ),
    # attention heads; key/value heads follow from these (_kv_heads)
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "mamba_n_heads",
            "mamba_num_heads",
        ),
        HEADS,
    ),
    **dict.fromkeys(
        (
            "head_dim",
            "d_kv",
            "kv_channels",
            "dim_head",
            "v_head_dim",
            "swa_head_dim",
            "linear_head_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "index_head_dim",
            "mamba_headdim",
            "attention_head_dim",
        ),
        HEAD_DIM,
    ),
    # multi-head latent attention (DeepSeek): a rope and a no-rope part of each query/key head
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM // 2),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "o_lora_rank"), 32),
    # feed-forward width
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "d_ff",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "n_inner",
            "hidden_dim",
            "d_inner",
            "dim_ff",
            "dff",
            "ffn_hidden_size",
            "feed_forward_size",
            "intermediate_size_mlp",
            "dense_intermediate_size",
        ),
        FFN,
    ),
    **dict.fromkeys(
        (
            "moe_intermediate_size",
            "expert_ffn_hidden_size",
            "shared_expert_intermediate_size",
            "shared_intermediate_size",
            "shared_experts_intermediate_size",
            "moe_shared_expert_intermediate_size",
        ),
        FFN // 2,
    ),
    # mixture of experts
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("num_experts_per_tok", "num_selected_experts", "moe_topk"), EXPERTS_PER_TOKEN),
    **dict.fromkeys(("n_group", "topk_group", "n_shared_experts", "num_shared_experts"), 1),
    "first_k_dense_replace": 1,  # layer 0 dense, layer 1 a mixture: both kinds are trained
    # vocabularies
    **dict.fromkeys(
        ("vocab_size", "decoder_vocab_size", "src_vocab_size", "tgt_vocab_size", "vocab_size_per_layer_input"), VOCAB
    ),
    "entity_vocab_size": 32,
    # positions
    **dict.fromkeys(
        (
            "max_position_embeddings",
            "n_positions",
            "n_ctx",
            "max_seq_len",
            "max_2d_position_embeddings",
            "max_encoder_position_embeddings",
            "max_decoder_position_embeddings",
            "max_target_positions",
            "max_source_positions",
            "context_length",
        ),
        POSITIONS,
    ),
    # local attention
    **dict.fromkeys(
        (
            "sliding_window",
            "attention_window",
            "local_attention",
            "window_size",
            "attention_chunk_size",
            "sliding_window_size",
            "local_attention_window_len",
            "attention_window_size",
        ),
        WINDOW,
    ),
    # state-space layers
    **dict.fromkeys(("mamba_d_state", "state_size", "ssm_state_size"), 16),
    **dict.fromkeys(("mamba_dt_rank", "time_step_rank", "mamba_chunk_size", "chunk_size"), 16),
}

# Key/value heads keep the type's grouping: as many as the query heads, one (multi-query), or a group.
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "encoder_kv_heads", "decoder_kv_heads")

# The width of the residual stream and the attention heads, where both must agree (size_problems).
WIDTHS = ("hidden_size", "d_model", "n_embd", "dim")
HEAD_COUNTS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
)

# Depth attributes: a list as long as the type's default depth is per-layer, and is cut to LAYERS.
DEPTHS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers")

# The few types whose defaults the rules above cannot shrink consistently, by hand.
TYPE_OVERRIDES: dict[str, dict] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # expanded into attention_layers, one per layer
    "mamba2": {"num_heads": 8},  # heads x head_dim must equal expand (2) x hidden_size
    # A quarter of HEAD_DIM is rotary: 2 frequencies, fewer than the 3 interleaved mRoPE sections, so a
    # section's slice would be empty (no real config has that); 64 gives 8, as real ones give 32.
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text"), {"head_dim": 64}),
}

# Float attributes whose name holds one of these are randomness in training: set to 0.0, so that the
# two engines see the same computation (dropout, layer drop, drop path, router jitter).
RANDOMNESS = ("drop", "jitter")


def _is_token_id_name(name: str) -> bool:
    return name.endswith(("_token_id", "_token_index"))


@dataclass
class SpecialIds:
    """Special token ids of a tiny config by name (``pad``, ``eos``, ...), all below ``vocab_size``."""

    vocab_size: int
    by_name: dict[str, int] = field(default_factory=dict)

    def ordinary(self) -> list[int]:
        """The ids a random row may use: none that the config or the tokenizer gives a meaning."""
        taken = set(self.by_name.values())
        return [i for i in range(self.vocab_size) if i not in taken]

    def free_id(self) -> int:
        return self.ordinary()[-1]


class _TokenIds:
    """Maps the token ids a config names to ids below VOCAB; equal ids stay equal (gpt2's bos = eos)."""

    def __init__(self, ids: set[int]):
        small = {i for i in ids if 0 <= i < VOCAB}
        spare = (i for i in range(VOCAB - 1, -1, -1) if i not in small)
        self.map = {i: i for i in small}
        self.map.update({i: next(spare) for i in sorted(ids - small)})

    def __call__(self, value):
        if isinstance(value, int) and not isinstance(value, bool):
            return self.map.get(value, value)
        if isinstance(value, list):
            return [self(v) for v in value]
        return value


def _token_ids(config, found: set[int]) -> set[int]:
    for name, value in vars(config).items():
        if _is_sub_config(value):
            _token_ids(value, found)
        elif _is_token_id_name(name):
            values = value if isinstance(value, list) else [value]
            found.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return found


def _is_sub_config(value) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# vars(), not getattr: some configs raise on reading a per-layer attribute globally (gemma4).
def _depth(config) -> int | None:
    return next((vars(config)[n] for n in DEPTHS if _is_int(vars(config).get(n))), None)


def _layer_pick(config, depth: int | None) -> list[int]:
    """The layers the tiny config keeps: the first LAYERS, plus the first layer of every kind the
    type's per-layer lists name (gemma3's full-attention layer is its 6th), in order."""
    if not depth:
        return []
    pick = set(range(min(depth, LAYERS)))
    for value in vars(config).values():
        if isinstance(value, list) and len(value) == depth and all(isinstance(v, str) for v in value):
            pick.update(value.index(kind) for kind in dict.fromkeys(value))
    return sorted(pick)


def _kv_heads(defaults, value) -> int | None:
    if not _is_int(value):
        return value  # None: as many as the query heads
    heads = next((vars(defaults)[n] for n in HEAD_COUNTS if _is_int(vars(defaults).get(n))), None)
    if heads is None or value >= heads:
        return HEADS
    return 1 if value == 1 else HEADS // 2


def _tiny_value(name: str, value, defaults, depth: int | None, pick: list[int], ids: _TokenIds):
    """The attribute's tiny value, or ``value`` itself when no rule applies."""
    if isinstance(value, bool):
        return value
    if name in DEPTHS and value == depth:
        return len(pick)
    if _is_token_id_name(name):
        return ids(value)
    if isinstance(value, float) and any(word in name.lower() for word in RANDOMNESS):
        return 0.0
    if name in KV_HEADS:
        return _kv_heads(defaults, value)
    if isinstance(value, int) and name in TINY_SIZES:
        return min(value, TINY_SIZES[name])
    if isinstance(value, list):
        if depth and len(pick) < depth and len(value) == depth:
            value = [value[i] for i in pick]  # per-layer: layer_types, mlp_layer_types, attention_window, ...
        if name in TINY_SIZES:  # per-layer sizes (longformer's attention windows)
            value = [min(v, TINY_SIZES[name]) if _is_int(v) else v for v in value]
    return value


def shrink(config_cls: type, defaults, ids: _TokenIds):
    """A ``config_cls`` built from ``defaults`` with every rule applied (sub-configs too)."""
    depth = _depth(defaults)
    pick = _layer_pick(defaults, depth)
    overrides = {}
    for name, value in vars(defaults).items():
        if name.startswith("_"):
            continue
        if _is_sub_config(value):
            overrides[name] = shrink(type(value), value, ids)  # not compared: some configs' __eq__ raises
            continue
        tiny = _tiny_value(name, value, defaults, depth, pick, ids)
        if tiny != value:
            overrides[name] = tiny
    overrides.update(TYPE_OVERRIDES.get(getattr(config_cls, "model_type", ""), {}))
    # Built anew, not edited: what a config derives in __post_init__ (head_dim, layer_types from the
    # depth, rope parameters) follows the tiny values.
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else None
    given = {k: v for k, v in overrides.items() if names is None or k in names}
    config = config_cls(**{**_init_kwargs(defaults, names), **given})
    for name, value in overrides.items():
        if name not in given:
            setattr(config, name, value)  # not an argument of the class: set after
    return config


def _init_kwargs(defaults, names: set[str] | None) -> dict:
    """The sub-configs a composite config was built with (a composite without them may not build)."""
    return {k: v for k, v in vars(defaults).items() if _is_sub_config(v) and (names is None or k in names)}


def tiny_config(model_type: str, task_needs: tuple[str, ...] = (), num_labels: int | None = None):
    """``(config, SpecialIds)`` for ``model_type``: its defaults, shrunk, with a pad id set (and the
    ids in ``task_needs``: ``"mask"``, ``"decoder_start"``). Raises whatever the type's own config
    class raises when it cannot be built."""
    from transformers import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[model_type]
    defaults = config_cls()
    config = shrink(config_cls, defaults, _TokenIds(_token_ids(defaults, set())))
    specials = SpecialIds(_vocab_size(config), _special_ids(config))
    text = config.get_text_config(decoder=True)
    for target in {id(config): config, id(text): text}.values():
        if getattr(target, "pad_token_id", None) is None:
            # Sequence classification of a decoder model finds each row's last token by its pad id.
            target.pad_token_id = specials.by_name.setdefault("pad", specials.free_id())
    specials.by_name.setdefault(
        "pad", config.pad_token_id if getattr(config, "pad_token_id", None) is not None else text.pad_token_id
    )
    if "mask" in task_needs:
        specials.by_name.setdefault("mask", specials.free_id())  # BERT's config names no mask id
    starts_decoder = "decoder_start" in task_needs or getattr(config, "is_encoder_decoder", False)
    if starts_decoder and getattr(config, "decoder_start_token_id", None) is None:
        # BART starts its decoder on eos, T5 on pad; a type naming neither gets its bos, else pad.
        config.decoder_start_token_id = specials.by_name.get("bos", specials.by_name["pad"])
    if num_labels is not None:
        config.num_labels = num_labels
    # transformers' generic token-classification head (GenericForTokenClassification) falls back to a
    # dropout of 0.1 when the config names none: an unset rate is randomness too.
    if getattr(config, "classifier_dropout", None) is None:
        config.classifier_dropout = 0.0
    return config, specials


def _vocab_size(config) -> int:
    text = config.get_text_config(decoder=True)
    return getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or VOCAB


def _special_ids(config) -> dict[str, int]:
    """``{"pad": 0, "eos": 2, ...}`` from every ``*_token_id`` of the config and its sub-configs."""
    found: dict[str, int] = {}
    configs = [config]
    while configs:
        current = configs.pop(0)
        for name, value in vars(current).items():
            if _is_sub_config(value):
                configs.append(value)
            elif _is_token_id_name(name):
                short = name.rsplit("_token_", 1)[0]
                for i, v in enumerate(value if isinstance(value, list) else [value]):
                    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v:
                        found.setdefault(short if i == 0 else f"{short}{i}", v)
    return found


def size_problems(config) -> list[str]:
    """Size attributes of ``config`` (and its sub-configs) above their tiny value, and head counts
    that do not divide the width: what a unit test asserts is empty for the types it samples."""
    problems = []
    by_hand = TYPE_OVERRIDES.get(getattr(config, "model_type", ""), {})
    kinds = {v for value in vars(config).values() if isinstance(value, list) for v in value if isinstance(v, str)}
    for name, value in vars(config).items():
        limit = LAYERS + len(kinds) if name in DEPTHS else TINY_SIZES.get(name)  # one layer of each kind kept
        if _is_sub_config(value):
            problems += [f"{name}.{p}" for p in size_problems(value)]
        elif limit is not None and _is_int(value) and value > limit and name not in by_hand:
            problems.append(f"{name}={value} > {limit}")
    width = next((vars(config)[n] for n in WIDTHS if _is_int(vars(config).get(n))), None)
    explicit_head_dim = any(_is_int(vars(config).get(n)) for n in ("head_dim", "d_kv", "kv_channels"))
    for name in HEAD_COUNTS:
        heads = vars(config).get(name)
        if width and _is_int(heads) and heads and width % heads and not explicit_head_dim:
            problems.append(f"{name}={heads} does not divide width {width}")
    return problems
