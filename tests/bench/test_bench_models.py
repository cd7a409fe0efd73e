"""`ort-hf bench` on a user's decoder model whose tokenizer has no pad token (GPT-2, Llama):
the padded classification workloads still build and run."""

from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from ort_hf.bench.models import build_model, load_tokenizer
from ort_hf.bench.spec import WORKLOADS, BenchSettings


def test_decoder_without_pad_token_gets_eos_as_padding(minilm_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    tokenizer.eos_token, tokenizer.pad_token = tokenizer.sep_token, None
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_positions=64,
        eos_token_id=tokenizer.eos_token_id,
        architectures=["GPT2LMHeadModel"],
    )
    assert config.pad_token_id is None
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    settings = BenchSettings(model_dir=str(tmp_path))
    loaded = load_tokenizer(settings)
    assert loaded.pad_token == loaded.eos_token
    model = build_model(WORKLOADS["sst2-dynamic"], settings, loaded)
    assert model.config.pad_token_id == loaded.eos_token_id
    batch = loaded(["a fine film", "dull"], padding=True, return_tensors="pt")
    assert batch["attention_mask"][1].sum() < batch["attention_mask"].shape[1]  # really padded
    # GPT-2's classifier refuses batches > 1 without a pad token id; with it, it runs.
    assert model(**batch).logits.shape == (2, 2)


def test_clm_gpt2_is_gpt2_shaped_with_its_vocabulary():
    """The dense-label GPT-2 workload: tied embeddings, Conv1D, gelu_new, 4 x 256, GPT-2's 50,257 words."""
    model = build_model(WORKLOADS["clm-gpt2"], BenchSettings(), tokenizer=None)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.activation_function == "gelu_new"
    assert (model.config.n_layer, model.config.n_embd, model.config.vocab_size) == (4, 256, 50257)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
