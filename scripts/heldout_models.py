"""Models of shapes the bench's own workloads do not have, written as model folders (random
weights from a seed, the packaged MiniLM's tokenizer) for ``ort-hf bench --model_dir``: causal LMs
for ``--workloads clm`` and a BERT masked LM for ``--workloads mlm,sst2-dynamic`` (its classifier
gets a new seeded head): the rows of ``docs/benchmarks.md`` ("Other shapes").

    python scripts/heldout_models.py --out /tmp/heldout
    ort-hf bench --out docs/results/heldout/llama-6x384-v32k --workloads clm \\
        --model_dir /tmp/heldout/llama-6x384-v32k --variants ort --rounds 2 --steps 10 \\
        --seq_len 512 --batch_size 4 --data_dir ../shared/data

(``docs/benchmarks.md`` has each model's sequence length and batch size.)"""

from __future__ import annotations

import argparse

MODELS = {  # built in this order from one seed
    # name: (config class, config)
    "llama-6x384-v32k": (
        "LlamaConfig",
        dict(
            vocab_size=32000,
            hidden_size=384,
            intermediate_size=1024,
            num_hidden_layers=6,
            num_attention_heads=6,
            num_key_value_heads=2,
        ),
    ),
    "gpt2-6x384": ("GPT2Config", dict(vocab_size=50257, n_embd=384, n_layer=6, n_head=6, n_positions=1024)),
    "mistral-4x512-v32k": (
        "MistralConfig",
        dict(
            vocab_size=32768,
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
        ),
    ),
    "bert-6x512": (
        "BertConfig",
        dict(vocab_size=30522, hidden_size=512, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=8),
    ),
    "smollm-30x576-v49k": (  # SmolLM2-135M's shape: deep and narrow, tied embeddings
        "LlamaConfig",
        dict(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            tie_word_embeddings=True,
        ),
    ),
    "gpt2-6x768": (
        "GPT2Config",
        dict(vocab_size=50257, n_embd=768, n_layer=6, n_head=12, n_positions=1024),
    ),  # distilgpt2's
    # OPT-125M's feed-forward (ReLU), width and vocabulary (GPT-2's, padded to 50,272), 6 layers
    "opt-6x768": (
        "OPTConfig",
        dict(vocab_size=50272, hidden_size=768, ffn_dim=3072, num_hidden_layers=6, num_attention_heads=12),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write one model folder per name into")
    args = parser.parse_args()
    import torch
    import transformers as tf

    from ort_hf.bench.sources import default_model_dir

    tokenizer = tf.AutoTokenizer.from_pretrained(default_model_dir())
    torch.manual_seed(0)
    for name, (config_cls, fields) in MODELS.items():
        positions = {} if "n_positions" in fields else {"max_position_embeddings": 1024}
        config = getattr(tf, config_cls)(**fields, **positions, use_cache=False, pad_token_id=0)
        mapping = tf.MODEL_FOR_MASKED_LM_MAPPING if config_cls == "BertConfig" else tf.MODEL_FOR_CAUSAL_LM_MAPPING
        model = mapping[type(config)](config)
        model.save_pretrained(f"{args.out}/{name}")
        tokenizer.save_pretrained(f"{args.out}/{name}")
        print(f"{args.out}/{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
