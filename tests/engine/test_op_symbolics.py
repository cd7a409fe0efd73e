"""The op rules of ``engine/symbolics`` added for the families the sweep found dying at export or
training wrongly: each op, forward and gradient, through ``wrap_model`` against PyTorch (fallback
disabled, ORT proven to have run).

- ``aten::histc`` (every mixture-of-experts family) and ``aten::_grouped_mm`` (transformers'
  default experts, the next op those families hit);
- ``aten::rms_norm`` (``nn.RMSNorm``: DiffLlama);
- ``aten::softplus`` and ORT's missing ``Softplus`` gradient (Doge, Jamba's Mamba);
- ``aten::exponential`` / ``aten::uniform`` (PhiMoE's router noise), drawn from torch's generator;
- ``aten::_convolution_mode`` (``padding="same"``), whose ``auto_pad`` ORT's CPU ConvGrad ignores;
- ``aten::linalg_solve_triangular`` (gated delta-net layers), an ATen node with its gradient;
- ``aten::scatter`` with a bool fill value (sparse-attention indexers) and its ``reduce=`` forms.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from parity import assert_parity, run_parity
from symbolic_cases import OPTIONS, Output, graph_ops

from ort_hf.engine import wrap_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Regression(torch.nn.Module):
    """``inner(x)`` fitted to ``target`` by squared error; the output is returned for comparison."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x, target):
        y = self.inner(x)
        return Output(loss=((y - target) ** 2).mean(), out=y)


def _batches(shapes, n=3, seed=0, scale=1.0):
    """``n`` batches; ``shapes(step)`` gives (x shape, target shape), so lengths may change per step."""
    g = torch.Generator().manual_seed(seed)
    return [
        {"x": torch.randn(*shapes(i)[0], generator=g) * scale, "target": torch.randn(*shapes(i)[1], generator=g)}
        for i in range(n)
    ]


def _outputs_match(model, batches, atol):
    """Forward outputs of PyTorch and ORT (another wrap of a copy: ``run_parity`` trains its own) agree."""
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, OPTIONS)
    wrapped.train()
    for batch in batches:
        torch.testing.assert_close(wrapped(**batch).out, reference(**batch).out, rtol=0, atol=atol)
    assert wrapped.engine_status().backend == "ort"
    return wrapped


# ---- histc ---------------------------------------------------------------------------------------


class Histogram(torch.nn.Module):
    def __init__(self, bins, low, high):
        super().__init__()
        self.lin = torch.nn.Linear(8, bins)
        self.bins, self.low, self.high = bins, low, high

    def forward(self, x, values):
        counts = torch.histc(values, bins=self.bins, min=self.low, max=self.high)
        return Output(loss=(self.lin(x) * counts).mean(), out=counts)


@pytest.mark.parametrize(
    "bins,low,high", [(4, 0, 3), (4, 0, 4), (7, -1.3, 2.9)], ids=["grouped-experts", "load-balancing", "float-range"]
)
def test_histc_counts_as_torch(bins, low, high):
    # transformers: histc(ids.float(), bins=E, min=0, max=E - 1) (grouped_mm experts) and max=E
    # (load-balancing losses). Values on every bin edge, outside the range, NaN and inf included.
    g = torch.Generator().manual_seed(0)
    batches = []
    for n in (40, 57, 23):
        values = torch.cat(
            [
                torch.randn(n, generator=g) * 3,
                torch.randint(-1, bins + 2, (n,), generator=g).float(),
                torch.linspace(low, high, bins + 1),
                torch.tensor([float("nan"), float("inf"), -5.0]),
            ]
        )
        batches.append(
            {"x": torch.randn(4, 8, generator=g), "values": values[torch.randperm(len(values), generator=g)]}
        )
    model = Histogram(bins, low, high)
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, OPTIONS)
    wrapped.train()
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    for batch in batches:
        got, want = wrapped(**batch), reference(**batch)
        assert torch.equal(got.out, want.out), (got.out, want.out)  # counts exactly
        got.loss.backward()
        want.loss.backward()
        torch.testing.assert_close(model.lin.weight.grad, reference.lin.weight.grad, rtol=1e-5, atol=1e-7)
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    assert wrapped.engine_status().backend == "ort"


# ---- _grouped_mm ---------------------------------------------------------------------------------


class GroupedExperts(torch.nn.Module):
    """transformers' grouped_mm experts in small: top-1 routing, tokens sorted by expert, counted
    with histc, one grouped matmul over the groups, scaled by the routing weight."""

    def __init__(self, experts=4, hidden=16, out=8):
        super().__init__()
        self.router = torch.nn.Linear(hidden, experts)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.weight = torch.nn.Parameter(torch.randn(experts, out, hidden) * 0.2)
        self.experts = experts

    def forward(self, x, target):
        gate, expert = self.router(x).softmax(-1).max(-1)
        expert_sorted, order = torch.sort(expert)
        counts = torch.histc(expert_sorted.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        y = torch.nn.functional.grouped_mm(self.proj(x)[order], self.weight.transpose(-2, -1), offs=offsets)
        y = y * gate[order, None]
        return Output(loss=((y - target[order]) ** 2).mean(), out=y)


def test_grouped_mm_trains_as_pytorch():
    # Token counts that are not multiples of 16 (the weight gradient pads them for torch's kernel).
    torch.manual_seed(0)
    batches = _batches(lambda i: ((13 + 6 * i, 16), (13 + 6 * i, 8)), n=4)
    result = run_parity(GroupedExperts(), batches, OPTIONS)
    assert_parity(*result)
    ops = graph_ops(result[-1])
    assert ops.count("ATen:_grouped_mm") == 3, ops  # the forward, dX and dW


# ---- rms_norm ------------------------------------------------------------------------------------


class Normed(torch.nn.Module):
    def __init__(self, norm, width=16):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.lin(x))


RMS_CASES = {
    # eps=None is finfo(float32).eps: inputs near 1e-3 make it and 1e-3 differ by far more than 1e-4
    "eps-none": lambda: Normed(torch.nn.RMSNorm(16)),
    "eps-no-weight": lambda: Normed(torch.nn.RMSNorm(16, eps=1e-3, elementwise_affine=False)),
    "two-dims": lambda: Normed(torch.nn.RMSNorm([5, 16], eps=1e-6)),
}


@pytest.mark.parametrize("case", sorted(RMS_CASES))
def test_rms_norm_trains_as_pytorch(case):
    torch.manual_seed(0)
    model = Regression(RMS_CASES[case]())
    for p in model.inner.lin.parameters():
        p.data.mul_(1e-3)
    if case != "eps-no-weight":
        model.inner.norm.weight.data.uniform_(0.5, 1.5)
    batches = _batches(lambda i: ((3, 5, 16), (3, 5, 16)), n=3)
    wrapped = _outputs_match(copy.deepcopy(model), batches[:1], atol=1e-5)
    assert "SimplifiedLayerNormalization" in graph_ops(wrapped)
    assert_parity(*run_parity(model, batches, OPTIONS))


def test_rms_norm_plain_export_is_standard_onnx():
    """Outside ORT training (``ORTTrainer.export_onnx``, any torch.onnx export at a registered opset) it is
    written in standard ops: the ONNX checker passes and onnxruntime computes torch's values."""
    import onnx
    import onnxruntime

    from ort_hf.engine.symbolics import register_training_symbolics

    register_training_symbolics(17)
    norm = torch.nn.RMSNorm([5, 16])
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16) * 1e-3
    buffer = io.BytesIO()
    torch.onnx.export(norm, (x,), buffer, opset_version=17, dynamo=False)
    onnx.checker.check_model(onnx.load_from_string(buffer.getvalue()), full_check=True)
    session = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    torch.testing.assert_close(got, norm(x).detach(), rtol=1e-5, atol=1e-6)


# ---- softplus ------------------------------------------------------------------------------------


class Softplus(torch.nn.Module):
    def __init__(self, beta, threshold):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return torch.nn.functional.softplus(self.lin(x), beta=self.beta, threshold=self.threshold)


@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 1.0), (0.5, 3.0)])
def test_softplus_trains_as_pytorch(beta, threshold):
    # Inputs spread over [-30, 30]: both sides of every threshold (torch returns x beyond it; a
    # Softplus without the threshold is 0.06 off near beta=2, threshold=1).
    torch.manual_seed(0)
    model = Regression(Softplus(beta, threshold))
    batches = _batches(lambda i: ((64, 8), (64, 8)), n=3, scale=10.0)
    _outputs_match(copy.deepcopy(model), batches[:1], atol=1e-5)
    assert_parity(*run_parity(model, batches, OPTIONS))


# ---- exponential / uniform -----------------------------------------------------------------------


class Noisy(torch.nn.Module):
    """PhiMoE's Gumbel draw (``-empty_like(x).exponential_().log()``) and a uniform one, read after it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, target):
        h = self.lin(x)
        gumbel = -torch.empty_like(h).exponential_(2.0).log()
        uniform = torch.empty_like(gumbel).uniform_(0.25, 0.75)  # drawn after the Gumbel noise
        y = h * gumbel * uniform
        return Output(loss=((y - target) ** 2).mean(), out=y)


def test_random_draws_come_from_torchs_generator():
    """Seeded alike, ORT's steps draw what PyTorch's draw, value for value, and train alike. (The
    first step is the export's, whose traced forward draws too: from then on.)"""
    model = Noisy()
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, OPTIONS)
    wrapped.train()
    batches = _batches(lambda i: ((6 + i, 8), (6 + i, 8)), n=4)
    wrapped(**batches[0]).loss.backward()  # export
    model.zero_grad()
    for seed, batch in enumerate(batches[1:]):
        torch.manual_seed(seed)
        want = reference(**batch)
        torch.manual_seed(seed)
        got = wrapped(**batch)
        torch.testing.assert_close(got.out, want.out, rtol=1e-6, atol=1e-6)
        got.loss.backward()
        want.loss.backward()
        torch.testing.assert_close(model.lin.weight.grad, reference.lin.weight.grad, rtol=1e-5, atol=1e-6)
        model.zero_grad(), reference.zero_grad()
    assert wrapped.engine_status().backend == "ort"
    ops = graph_ops(wrapped)
    assert "ATen:exponential" in ops and "ATen:uniform" in ops, ops


# ---- convolution with padding="same" -------------------------------------------------------------

CONV_CASES = {
    # name -> (module, x shape, y shape)
    "1d-k3": (lambda: torch.nn.Conv1d(4, 6, 3, padding="same"), (2, 4, 9), (2, 6, 9)),
    "1d-k4-dilated": (lambda: torch.nn.Conv1d(4, 6, 4, padding="same", dilation=2), (2, 4, 9), (2, 6, 9)),
    "1d-depthwise": (lambda: torch.nn.Conv1d(4, 4, 5, padding="same", groups=4), (2, 4, 9), (2, 4, 9)),
    "2d-k2x3": (lambda: torch.nn.Conv2d(3, 5, (2, 3), padding="same"), (2, 3, 7, 6), (2, 5, 7, 6)),
    "1d-valid": (lambda: torch.nn.Conv1d(4, 6, 3, padding="valid"), (2, 4, 9), (2, 6, 7)),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_same_padding_convolution_trains_as_pytorch(case):
    # Before: ORT's CPU ConvGrad read no padding from auto_pad (dX and dW off by 1e-2 to 0.4), and
    # its Conv refused auto_pad with a dilation.
    make, x_shape, y_shape = CONV_CASES[case]
    torch.manual_seed(0)
    result = run_parity(Regression(make()), _batches(lambda i: (x_shape, y_shape), n=3), OPTIONS)
    assert_parity(*result)
    graph = result[-1].training_graph().graph
    convs = [{a.name: a for a in n.attribute} for n in graph.node if n.op_type == "Conv"]
    assert convs
    for attrs in convs:  # explicit pads, which ConvGrad reads; auto_pad absent or NOTSET
        assert "pads" in attrs and (attrs["auto_pad"].s if "auto_pad" in attrs else b"NOTSET") == b"NOTSET"


# ---- linalg_solve_triangular ---------------------------------------------------------------------


class TriangularSolve(torch.nn.Module):
    """``solve_triangular(A, lin(x))`` with a trained full matrix ``A`` (the solver reads one triangle:
    the gradient of the other must be zero, as torch's is); ``A`` may broadcast over ``x``'s batch."""

    def __init__(self, width, a_batch=(), **flags):
        super().__init__()
        self.flags = flags
        self.a = torch.nn.Parameter(torch.randn(*a_batch, 5, 5) * 0.3 + 3 * torch.eye(5))
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x, target):
        y = torch.linalg.solve_triangular(self.a, self.lin(x), **self.flags)
        return Output(loss=((y - target) ** 2).mean(), out=y)


SOLVE_CASES = {
    # the gated delta-net layers' call
    "lower-unit": dict(upper=False, unitriangular=True),
    "upper-broadcast": dict(upper=True, a_batch=(3, 1)),
    "right-lower": dict(upper=False, left=False),
    "right-upper-unit-broadcast": dict(upper=True, left=False, unitriangular=True, a_batch=(2,)),
}


@pytest.mark.parametrize("case", sorted(SOLVE_CASES))
def test_solve_triangular_trains_as_pytorch(case):
    flags = dict(SOLVE_CASES[case])
    a_batch = flags.pop("a_batch", ())
    shape = (3, 2, 5, 6) if flags.get("left", True) else (3, 2, 6, 5)
    torch.manual_seed(0)
    result = run_parity(TriangularSolve(shape[-1], a_batch, **flags), _batches(lambda i: (shape, shape)), OPTIONS)
    assert_parity(*result)
    ops = graph_ops(result[-1])
    assert ops.count("ATen:linalg_solve_triangular") == 3, ops  # the forward, dB and dA


# ---- scatter -------------------------------------------------------------------------------------


class TopKMask(torch.nn.Module):
    """The sparse-attention indexers' mask (``ones(bool).scatter(-1, top, False)``), and a scatter of
    ``src`` that needs a gradient."""

    def __init__(self, fill):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.fill = fill

    def forward(self, x, target):
        h = self.lin(x)
        top = h.topk(3, dim=-1).indices
        mask = torch.ones_like(h, dtype=torch.bool).scatter(-1, top, self.fill)
        out = h.masked_fill(mask if not self.fill else ~mask, 0.0)
        out = out + torch.zeros_like(h).scatter(-1, top, h.gather(-1, top) * 2)
        return Output(loss=((out - target) ** 2).mean(), out=out)


@pytest.mark.parametrize("fill", [False, True])
def test_scatter_of_a_bool_value_trains_as_pytorch(fill):
    torch.manual_seed(0)
    result = run_parity(TopKMask(fill), _batches(lambda i: ((4, 5 + i, 8), (4, 5 + i, 8))), OPTIONS)
    assert_parity(*result)


class ScatterReduce(torch.nn.Module):
    """Integer counts built with ``scatter(..., reduce=)`` (repeated indices), scaling a trained output."""

    def __init__(self, reduce):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.reduce = reduce

    def forward(self, x, target):
        h = self.lin(x)
        top = h.topk(3, dim=-1).indices
        counts = torch.ones_like(h, dtype=torch.long).scatter(-1, top, 2, reduce=self.reduce)
        counts = counts.scatter(-1, top[..., :1].expand_as(top), (top % 2) + 1, reduce=self.reduce)
        out = h * counts
        return Output(loss=((out - target) ** 2).mean(), out=out)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_reduce_forms_train_as_pytorch(reduce):
    torch.manual_seed(0)
    result = run_parity(ScatterReduce(reduce), _batches(lambda i: ((4, 5 + i, 8), (4, 5 + i, 8))), OPTIONS)
    assert_parity(*result)
    assert "ScatterElements" in graph_ops(result[-1])


def test_scatter_reduce_on_a_trained_tensor_is_refused():
    # torch defines no derivative for the reduce forms; ORT's ScatterElements gradient would ignore
    # the reduction and train on a wrong gradient.
    class FloatReduce(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, target):
            h = self.lin(x)
            out = h.scatter(-1, h.topk(3, dim=-1).indices, 2.0, reduce="multiply")
            return Output(loss=((out - target) ** 2).mean(), out=out)

    wrapped = wrap_model(FloatReduce(), OPTIONS)
    with pytest.raises(Exception, match="aten::scatter with reduce='multiply' on a tensor that may need a gradient"):
        wrapped(**_batches(lambda i: ((4, 5, 8), (4, 5, 8)), n=1)[0])
