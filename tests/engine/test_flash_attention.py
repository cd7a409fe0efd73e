"""engine/symbolics/flash_attention.py: SDPA attention in a CPU training graph runs as PyTorch's own
flash-attention kernel (an ATen node and its backward), the kernel eager SDPA chooses, with eager's
losses and gradients; the attention probabilities are no longer in the graph; dropout, a float mask or
the switch off keep the decomposition."""

import pytest
import torch
import torch.nn.functional as F
from parity import assert_parity, run_parity
from tiny_models import FAMILIES, build, make_batch

from ort_hf.engine import ORTOptions
from ort_hf.engine.symbolics.flash_attention import FLASH, FLASH_BACKWARD, OWN

# the operators of the graph's nodes: ort_hf's wrappers of the kernel and its backward
OWN_FLASH, OWN_BACKWARD = (OWN[name][0].encode() for name in (FLASH, FLASH_BACKWARD))


def _aten_operators(wrapped) -> list[bytes]:
    graph = wrapped.training_graph().graph
    return [a.s for n in graph.node if n.op_type == "ATen" for a in n.attribute if a.name == "operator"]


def _softmaxes(wrapped) -> int:
    return sum(n.op_type == "Softmax" for n in wrapped.training_graph().graph.node)


def test_eager_sdpa_runs_this_kernel_where_the_graph_does():
    """The premise: for float32 attention without dropout, eager SDPA picks the flash kernel, with
    is_causal or a boolean mask, and the kernel called as the graph calls it gives eager's bits."""
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 19, 8, requires_grad=True) for _ in range(3))
    keep = torch.ones(19, 19, dtype=torch.bool).tril().expand(2, 1, 19, 19).clone()
    keep[1, :, 3] = False  # a query row with no key: 0 out, as eager
    for mask, causal in ((None, True), (keep, False)):
        assert torch._fused_sdp_choice(q, k, v, mask, 0.0, causal) == SDPBackend.FLASH_ATTENTION.value
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        grad = torch.randn_like(expected)
        expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
        additive = None if mask is None else torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        out, lse = getattr(torch.ops.aten, FLASH)(q.detach(), k.detach(), v.detach(), 0.0, causal, attn_mask=additive)
        assert torch.equal(out, expected.detach())
        grads = getattr(torch.ops.aten, FLASH_BACKWARD)(
            grad, q.detach(), k.detach(), v.detach(), out, lse, 0.0, causal, attn_mask=additive
        )
        assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads))


def test_grouped_keys_go_into_the_kernel_with_their_own_heads():
    """Eager's ``enable_gqa`` passes 2-head keys and values to the kernel for 4 query heads: called
    so, it gives eager's bits; repeating them first changes the key and value gradients' sums."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 19, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 19, 8, requires_grad=True) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    grad = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
    operands = [t.detach() for t in (q, k, v)]
    out, lse = getattr(torch.ops.aten, FLASH)(*operands, 0.0, True)
    assert torch.equal(out, expected.detach())
    grads = getattr(torch.ops.aten, FLASH_BACKWARD)(grad, *operands, out, lse, 0.0, True)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads))


def _kernel_and_wrapper(q, k, v, grad, mask, causal, threads):
    """The kernel and its backward, and ort_hf's wrappers of them, with ``threads``."""
    import ort_hf.engine  # noqa: F401  (ort_hf's kernels are loaded with the engine)
    from ort_hf.engine.runtime import ensure_engine

    ensure_engine()
    results = []
    for forward, backward, extra in (
        (getattr(torch.ops.aten, FLASH), getattr(torch.ops.aten, FLASH_BACKWARD), {}),
        (torch.ops.ort_hf.flash_attention, torch.ops.ort_hf.flash_attention_backward, {"threads": threads}),
    ):
        out, lse = forward(q, k, v, 0.0, causal, attn_mask=mask, scale=None, **extra)
        grads = backward(grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=None, **extra)
        results.append((out, lse, *grads))
    return results


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mask_kind", ["causal", "causal-left-padded", "bidirectional-padded", "none-causal"])
def test_the_wrapper_gives_the_kernels_bits(mask_kind, threads):
    """ort_hf's wrapper runs causal where the mask hides every later key (eager's unpadded case,
    which skips the blocks above the diagonal), with PyTorch's threads: the same bits as the kernel
    on one thread with the mask alone, for grouped-query attention too."""
    torch.manual_seed(0)
    length = 150  # more than one of the kernel's key blocks
    q, grad = torch.randn(2, 4, length, 16), torch.randn(2, 4, length, 16)
    k, v = torch.randn(2, 2, length, 16), torch.randn(2, 2, length, 16)
    keep = torch.ones(2, 1, length, length, dtype=torch.bool)
    if mask_kind.startswith("causal"):
        keep = keep.tril()
    if mask_kind.endswith("padded"):
        keep[1, :, :, :37] = False
    mask = None if mask_kind == "none-causal" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as in ORT's graph
    try:
        kernel, wrapper = _kernel_and_wrapper(q, k, v, grad, mask, mask_kind == "none-causal", threads)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(kernel, wrapper))


def test_the_wrappers_results_are_contiguous_and_from_1_mib_on_kept_buffers(aten_nodes_run):
    """On x86-64 the wrappers call the kernel's dispatch stubs with results of their own
    (csrc/cpu_flash_attention.cpp): contiguous, the kernel's bits, and from 1 MiB up written into a
    buffer released by an earlier result, not into a block malloc hands out again."""
    import platform

    from ort_hf.engine.cpu_kernel_swaps import release_kernel_buffers
    from ort_hf.engine.extensions import _dispatch_stub_flags

    if platform.machine() != "x86_64":
        pytest.skip("the dispatch stubs' capabilities are known for x86-64 only (engine/extensions.py)")
    assert "-DORT_HF_DISPATCH_STUBS" in _dispatch_stub_flags()
    forward, backward = torch.ops.ort_hf.flash_attention, torch.ops.ort_hf.flash_attention_backward
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(2, 8, 320, 64, generator=g) for _ in range(4))  # 1.25 MiB each
    want_out, want_lse = getattr(torch.ops.aten, FLASH)(q, k, v, 0.0, True)
    want_grads = getattr(torch.ops.aten, FLASH_BACKWARD)(grad, q, k, v, want_out, want_lse, 0.0, True)

    held = forward(q, k, v, 0.0, True, None, None, 1)
    second = forward(q, k, v, 0.0, True, None, None, 1)
    kept = second[0].data_ptr()
    assert kept != held[0].data_ptr()
    del second
    other = torch.empty(q.shape)  # would get the freed block, were it not kept
    assert other.data_ptr() != kept
    out, lse = forward(q, k, v, 0.0, True, None, None, 1)
    assert out.data_ptr() == kept

    held_grads = backward(grad, q, k, v, out, lse, 0.0, True, None, None, 1)
    second_grads = backward(grad, q, k, v, out, lse, 0.0, True, None, None, 1)
    kept_grads = {t.data_ptr() for t in second_grads}
    assert not kept_grads & {t.data_ptr() for t in held_grads}
    del second_grads
    others = [torch.empty(q.shape) for _ in range(3)]
    assert not kept_grads & {t.data_ptr() for t in others}
    grads = backward(grad, q, k, v, out, lse, 0.0, True, None, None, 1)
    assert len(kept_grads & {t.data_ptr() for t in grads}) >= 2  # the fourth may take the output gradient's copy
    for got, want in ((out, want_out), (lse, want_lse), *zip(grads, want_grads), *zip(held_grads, want_grads)):
        assert got.is_contiguous() and torch.equal(got, want)
    release_kernel_buffers()


class _TwoAttentions(torch.nn.Module):
    """Two attentions over one input; the second's values are narrower than its queries and keys
    (as in DeepSeek's multi-head latent attention), where eager SDPA takes its math kernel."""

    def __init__(self, value_width: int):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.second = torch.nn.Linear(16, 32 + 4 * value_width)
        self.value_width = value_width

    def forward(self, x, labels):
        from transformers.modeling_outputs import CausalLMOutput

        heads = lambda t, width: t.view(*t.shape[:-1], -1, width).transpose(1, 2)  # noqa: E731
        q, k, v = (heads(t, 4) for t in self.qkv(x).split(16, dim=-1))
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        q2, k2, v2 = self.second(x + h).split([16, 16, 4 * self.value_width], dim=-1)
        out = F.scaled_dot_product_attention(heads(q2, 4), heads(k2, 4), heads(v2, self.value_width), is_causal=True)
        loss = F.mse_loss(out.transpose(1, 2).flatten(2).sum(-1), labels)
        return CausalLMOutput(loss=loss)


@pytest.mark.parametrize("value_width", [4, 2], ids=["equal-widths", "narrow-values"])
def test_a_model_where_eager_leaves_the_kernel_once_keeps_the_decomposition(value_width):
    """The symbolic sees dynamic shapes; eager's choice on the traced tensors decides, for the
    whole model: one attention off the kernel keeps every attention on the decomposition."""
    from ort_hf.engine import wrap_model

    torch.manual_seed(0)
    model = _TwoAttentions(value_width).train()
    batch = {"x": torch.randn(2, 7, 16), "labels": torch.randn(2, 7)}
    expected = model(**batch).loss
    wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR", cpu_flash_attention=True))
    wrapped.train()
    loss = wrapped(**batch).loss
    loss.backward()
    assert wrapped.engine_status().backend == "ort"
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    flash_nodes = _aten_operators(wrapped).count(OWN_FLASH)
    assert (flash_nodes, _softmaxes(wrapped)) == ((2, 0) if value_width == 4 else (0, 2))


@pytest.mark.parametrize("family", ["llama-clm", "gpt2-clm", "bert-cls"])
def test_a_tiny_model_with_sdpa_trains_on_the_flash_kernel_with_eagers_values(family):
    """Llama (grouped-query attention), GPT-2 and BERT (bidirectional), padded rows: a boolean mask."""
    generator = torch.Generator().manual_seed(1)
    batches = [make_batch(FAMILIES[family].task, generator) for _ in range(2)]
    assert (batches[0]["attention_mask"] == 0).any()
    model = build(FAMILIES[family], attn="sdpa").train()
    layers = model.config.num_hidden_layers
    ref_losses, ort_losses, ref_grads, ort_grads, wrapped = run_parity(
        model, batches, ORTOptions(fallback="disable", cpu_flash_attention=True)
    )
    assert_parity(ref_losses, ort_losses, ref_grads, ort_grads, wrapped, loss_atol=1e-5)
    operators = _aten_operators(wrapped)
    assert operators.count(OWN_FLASH) == operators.count(OWN_BACKWARD) == layers
    assert _softmaxes(wrapped) == 0  # no attention probabilities left in the graph
    for name, grad in ref_grads.items():
        if grad is not None:
            torch.testing.assert_close(ort_grads[name], grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "dropout, switches",
    [(0.0, {"cpu_flash_attention": False}), (0.1, {"cpu_flash_attention": True})],
    ids=["switched-off", "attention-dropout"],
)
def test_otherwise_the_decomposition_stays(dropout, switches):
    generator = torch.Generator().manual_seed(1)
    batches = [make_batch("clm", generator) for _ in range(2)]
    model = build(FAMILIES["llama-clm"], dropout=dropout, attn="sdpa").train()
    options = ORTOptions(fallback="disable", log_level="ERROR", **switches)
    *results, wrapped = run_parity(model, batches, options)
    if dropout == 0.0:
        assert_parity(*results, wrapped, loss_atol=1e-5)
    assert not any(b"flash" in op for op in _aten_operators(wrapped))
    assert _softmaxes(wrapped) == model.config.num_hidden_layers


def test_attention_whose_keys_need_no_gradient_trains_too():
    """LoRA's case: only the query and value projections train, so the first layer's keys need no
    gradient, and the kernel's backward still returns one."""
    generator = torch.Generator().manual_seed(1)
    batches = [make_batch("clm", generator) for _ in range(2)]
    model = build(FAMILIES["llama-clm"], attn="sdpa").train()
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith(("q_proj.weight", "v_proj.weight")))
    *results, wrapped = run_parity(
        model, batches, ORTOptions(fallback="disable", log_level="ERROR", cpu_flash_attention=True)
    )
    assert_parity(*results, wrapped, loss_atol=1e-5)
    assert _aten_operators(wrapped).count(OWN_BACKWARD) == model.config.num_hidden_layers
