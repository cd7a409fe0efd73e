"""Trailing padding is dropped before ORT on CPU, with unchanged results and no re-export."""

import torch
from parity import assert_parity, run_parity
from tiny_models import BATCH, FAMILIES, SEQ, build, ragged_batch

from ort_hf.engine import ORTOptions, wrap_model
from ort_hf.engine.padding import trim_trailing_padding


def test_trim_drops_only_all_padding_columns():
    gen = torch.Generator().manual_seed(0)
    batch = ragged_batch([5, 9, 3, 7], "mlm", gen)
    trimmed, kept, total = trim_trailing_padding(batch)
    assert (kept, total) == (9, SEQ) and trimmed["input_ids"].shape == (4, 9) and trimmed["labels"].shape == (4, 9)
    assert all(v.is_contiguous() for v in trimmed.values())  # a model may view() them
    left = ragged_batch([5, 9, 3, 7], "mlm", gen, pad_left=True)
    assert trim_trailing_padding(left)[0]["input_ids"].shape == (4, SEQ)  # left padding: nothing to drop
    labelled = dict(batch)
    labelled["labels"] = batch["input_ids"].clone()  # labels on padding: dropping would change the loss
    assert trim_trailing_padding(labelled)[0]["input_ids"].shape == (4, SEQ)


def test_trimmed_training_matches_pytorch_and_exports_once():
    gen = torch.Generator().manual_seed(1)
    lengths = [[SEQ] * BATCH] + [[int(n) for n in torch.randint(3, SEQ, (BATCH,), generator=gen)] for _ in range(9)]
    for family in ("bert-mlm", "gpt2-clm", "bert-cls"):
        fam = FAMILIES[family]
        batches = [ragged_batch(ls, fam.task, gen) for ls in lengths]  # first batch unpadded, then ragged
        result = run_parity(build(fam, attn="sdpa"), batches)
        wrapped = result[-1]
        assert_parity(*result)
        assert wrapped.padding_stats["kept_tokens"] < wrapped.padding_stats["total_tokens"]
        assert wrapped.engine_status().export_count == 1, "a new sequence length must not re-export"


def test_trimming_can_be_turned_off():
    fam = FAMILIES["bert-cls"]
    wrapped = wrap_model(build(fam), ORTOptions(fallback="disable", log_level="ERROR", trim_padding=False))
    wrapped.train()
    wrapped(**ragged_batch([4, 5, 6, 7], "cls", torch.Generator().manual_seed(2))).loss.backward()
    assert wrapped.padding_stats["total_tokens"] == 0 and wrapped.engine_status().backend == "ort"


def test_an_encoder_decoders_target_side_is_neither_trimmed_nor_checked_against_the_source_mask():
    """Labels as long as the source (by chance, as a collator's pad_to_multiple_of makes them) with
    real labels past the source's last token: the trim drops the source's padding columns only, and
    the padding checks do not read the labels as the source's (a refusal of the second batch, before)."""
    from tiny_models import EXTRA_FAMILIES

    gen = torch.Generator().manual_seed(3)
    batches = []
    for lengths in ([5, 9, 3, 7], [8, 4, 6, 2]):
        batch = ragged_batch(lengths, "s2s", gen)
        batch["labels"] = torch.randint(3, 90, (4, SEQ), generator=gen)  # every target position labelled
        batches.append(batch)
    options = ORTOptions(
        fallback="disable", log_level="ERROR", preflight="never", trim_padding=True, eliminate_padding=True
    )
    result = run_parity(build(EXTRA_FAMILIES["t5-s2s"]), batches, options)
    assert_parity(*result)
    stats = result[-1].padding_stats
    assert stats["kept_tokens"] == (9 + 8) * 4 and stats["total_tokens"] == 2 * SEQ * 4  # the source's columns
