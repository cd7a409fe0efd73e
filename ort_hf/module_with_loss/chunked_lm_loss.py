"""A causal LM's vocabulary projection and cross-entropy over dense labels, fused and in row chunks:
the ``(tokens, vocab)`` logits are never materialised, and no logits cross the ORT/PyTorch boundary.

With dense labels (every position counts) label sparsity has nothing to drop, and the head is most
of a small LM's step: at 2,048 tokens and GPT-2's 50,257-word vocabulary the logits are 411 MB,
and the model's own loss writes three more buffers that size a step (log-softmax, the zero-filled
gradient of ``nll_loss``, the gradient of the log-softmax), each freshly mapped memory whose page
faults cost about as much as the arithmetic. Here the forward pass takes the rows a chunk at a time
(``CHUNK_ELEMENTS`` logits): projection, softmax in place, loss, then, while the chunk is still
there, its gradient (``softmax - one_hot(label)`` on counted rows) multiplied into the gradients of
the hidden states and of the head's weight and bias. The backward pass only scales those by the
incoming gradient. The arithmetic is the model's own (``logsumexp - logit[label]`` summed over
labels that are not ``ignore_index``, the projection as ``nn.Linear`` computes it), in one chunk
buffer that is kept from call to call on the CPU (:func:`release_spare_buffer` drops it): 128 MB
of fresh pages to fault in every step otherwise.

Inside ORT the Function runs as a ``PythonOp`` (ORT's custom autograd, the form ORT's label
sparsity detector takes too): the backbone's forward and backward stay ORT's graph. ORT runs its
graph with PyTorch on one thread (``ORTOptions.torch_threads_in_graph``: PyTorch's OpenMP workers
would spin on ORT's cores after every ATen node); the chunks' GEMMs are most of a small LM's step,
so the forward takes ``threads`` (PyTorch's count outside the graph) for its duration. Where
``product`` names an entry of ``PRODUCTS`` (the engine's, on ORT's MatMul and Gemm:
``engine/cpu_head_products.py``), the chunks' forward product ``h @ weight.T`` (no bias) and their
gradient products run on it where it takes them, else on PyTorch's ``mm``.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import torch

# Logits per chunk: 32M floats (128 MB), about 670 rows at a 50k vocabulary. Fewer, larger chunks
# mean larger GEMMs and fewer passes accumulating the head weight's (vocabulary-sized) gradient; on
# a 2-core AMD EPYC, chunks of 160 rows left the fused loss no faster than the unchunked one.
CHUNK_ELEMENTS = 1 << 25

# The chunks' products other than mm, by name: objects with ``forward_product(h, weight, out)``,
# ``input_grad(z, weight, out)`` and ``weight_grad(z, h, out, accumulate)``, each returning whether it
# ran (engine/cpu_head_products.py: HeadProducts). The Function takes the name, a string, which
# ORT's PythonOp and its export cache keep (engine/python_op_cache.py).
PRODUCTS: dict = {}

# The last call's chunk buffer on the CPU: taken out while a call uses it, so a concurrent call makes
# its own. One at most: a second model's buffer replaces the first's.
_spare: torch.Tensor | None = None
_spare_lock = threading.Lock()


def release_spare_buffer() -> None:
    """Drop the chunk buffer kept for the next call (its model is gone)."""
    global _spare
    with _spare_lock:
        _spare = None


def _take_buffer(like: torch.Tensor, rows: int, vocab: int) -> torch.Tensor:
    global _spare
    with _spare_lock:
        buffer = _spare
        if (
            buffer is not None
            and buffer.device == like.device
            and buffer.shape == (rows, vocab)
            and buffer.dtype == like.dtype
        ):
            _spare = None
            return buffer
    return like.new_empty(rows, vocab)


def _keep_buffer(buffer: torch.Tensor) -> None:
    global _spare
    if buffer.device.type == "cpu":  # CUDA's caching allocator keeps freed blocks itself
        with _spare_lock:
            _spare = buffer


@contextlib.contextmanager
def _untraced_body():
    """While ORT's export traces the model, this Function's body runs under the tracer, which warns
    about its Python loop over chunks and its tensor-to-bool reads. The graph holds the Function as
    one PythonOp instead, its body not traced (the first step refuses a graph where it is not:
    ``trainer/first_step.py``), so those warnings are silenced then, and only then."""
    if not torch.jit.is_tracing():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        yield


def _logits(product, h, weight, bias, out) -> None:
    """A chunk's logits ``h @ weight.T + bias`` into ``out``."""
    if bias is not None:
        torch.addmm(bias, h, weight.t(), out=out)
    elif product is None or not product.forward_product(h, weight, out):
        torch.mm(h, weight.t(), out=out)


def _input_grad(product, z, weight, out) -> None:
    """The chunk's hidden states' gradient ``z @ weight`` into ``out``."""
    if product is None or not product.input_grad(z, weight, out):
        torch.mm(z, weight, out=out)


def _weight_grad(product, z, h, out, accumulate: bool) -> None:
    """The chunk's part of the weight's gradient ``z.T @ h``, written to ``out`` or added to it."""
    if product is not None and product.weight_grad(z, h, out, accumulate):
        return
    if accumulate:
        out.addmm_(z.t(), h)
    else:
        torch.mm(z.t(), h, out=out)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(F.linear(hidden, weight, bias), labels, ignore_index, reduction="sum")``
    for 2-D float32 ``hidden`` (rows, features) and 1-D ``labels``, in row chunks."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index: int, threads: int, product: str | None = None):
        outside = torch.get_num_threads()
        torch.set_num_threads(max(threads, outside))
        try:
            with _untraced_body():
                return ChunkedLinearCrossEntropy._fused(ctx, hidden, weight, bias, labels, ignore_index, product)
        finally:
            torch.set_num_threads(outside)

    @staticmethod
    def _fused(ctx, hidden, weight, bias, labels, ignore_index: int, product_name):
        rows, vocab = hidden.shape[0], weight.shape[0]
        wants = ctx.needs_input_grad
        grad_hidden = torch.empty_like(hidden) if wants[0] else None
        # Written by the first chunk's product, added to by the others: no zero-filled pass first.
        grad_weight = (torch.empty_like(weight) if rows else torch.zeros_like(weight)) if wants[1] else None
        grad_bias = torch.zeros_like(bias) if bias is not None and wants[2] else None
        any_grad = grad_hidden is not None or grad_weight is not None or grad_bias is not None
        valid = labels != ignore_index
        target = labels.masked_fill(~valid, 0)
        step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
        product = PRODUCTS.get(product_name) if product_name is not None else None
        buffer = _take_buffer(hidden, min(step, rows), vocab)
        total = hidden.new_zeros(())
        for start in range(0, rows, step):
            end = min(start + step, rows)
            h, t, counted = hidden[start:end], target[start:end], valid[start:end]
            z = buffer[: end - start]
            _logits(product, h, weight, bias, z)
            # In place, one pass over the chunk from memory (each row's passes run in cache). A row's
            # loss is then -log of its softmax at the label: no pass over the chunk for the row maxima
            # or the logsumexp (each a read of the whole chunk, 7 ms of a chunk's 200 on a 2-core Intel
            # Xeon: scripts/fused_loss_chunk_microbench.py, docs/results/kernel-profiles/<cpu>/).
            torch.softmax(z, dim=1, out=z)
            at_label = z.gather(1, t.unsqueeze(1)).squeeze(1)  # raises on a label out of range, as nll_loss
            row_loss = torch.where(counted, -at_label.log(), 0.0)
            # Below the smallest normal float the softmax has lost digits, or is 0 (a loss above 87):
            # those rows' loss is logsumexp - logit from their logits, recomputed.
            lost = (counted & (at_label < torch.finfo(z.dtype).tiny)).nonzero().squeeze(1)
            if lost.numel():
                logits = torch.nn.functional.linear(h[lost], weight, bias)
                label_logit = logits.gather(1, t[lost].unsqueeze(1)).squeeze(1)
                row_loss[lost] = torch.logsumexp(logits, dim=1) - label_logit
            total += row_loss.sum()
            if not any_grad:
                continue
            # The softmax's gradient: minus one at the label, zero on ignored rows
            z[torch.arange(end - start, device=z.device), t] -= 1
            ignored = (~counted).nonzero().squeeze(1)
            if ignored.numel():
                z.index_fill_(0, ignored, 0.0)
            if grad_hidden is not None:
                _input_grad(product, z, weight, grad_hidden[start:end])
            if grad_weight is not None:
                _weight_grad(product, z, h, grad_weight, accumulate=start > 0)
            if grad_bias is not None:
                grad_bias += z.sum(dim=0)
        _keep_buffer(buffer)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in (grad_hidden, grad_weight, grad_bias)))
        ctx.has = (grad_hidden is not None, grad_weight is not None, grad_bias is not None)
        return total

    @staticmethod
    def backward(ctx, grad):
        # In place: the saved gradients are this Function's own and read once (a second backward
        # through the same graph fails autograd's check of their version instead of reading them
        # scaled). The head weight's is vocabulary-sized (31 MB at 30,522 x 256): a new tensor for it
        # is fresh pages to fault in, most of this backward's time in ORT's profile of the bench's clm.
        saved = ctx.saved_tensors
        return (*(g.mul_(grad) if has else None for g, has in zip(saved, ctx.has)), None, None, None, None)


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    ignore_index: int,
    threads: int = 1,
    product: str | None = None,
) -> torch.Tensor:
    """The summed cross-entropy of ``hidden @ weight.T + bias`` against ``labels`` (2-D hidden,
    1-D labels), without the full logits; ``threads``: PyTorch's threads for it, at least;
    ``product``: the name in :data:`PRODUCTS` of the chunks' products, if not mm."""
    return ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, ignore_index, threads, product)
