"""Custom autograd functions run in ORT as PythonOp (the ported torch_interop_utils)."""

import copy

import pytest
import torch

from ort_hf.engine import ORTOptions, wrap_model

STRICT = ORTOptions(fallback="disable", log_level="ERROR")


class ScaledSwish(torch.autograd.Function):
    """Takes non-tensor arguments (a float and an int)."""

    @staticmethod
    def forward(ctx, x, scale: float, shift: int):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * torch.sigmoid(x) * scale + shift

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * ctx.scale * (s + x * s * (1 - s)), None, None


class ReluAndSquare(torch.autograd.Function):
    """Returns two tensors."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.relu(x), x * x

    @staticmethod
    def backward(ctx, grad_relu, grad_square):
        (x,) = ctx.saved_tensors
        return grad_relu * (x > 0).to(x.dtype) + grad_square * 2 * x


class AddOneInPlace(torch.autograd.Function):
    """Modifies its input in place (mark_dirty)."""

    @staticmethod
    def forward(ctx, x):
        x.add_(1.0)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class Net(torch.nn.Module):
    def __init__(self, in_place: bool = False):
        super().__init__()
        self.first = torch.nn.Linear(16, 32)
        self.second = torch.nn.Linear(32, 4)
        self.in_place = in_place

    def forward(self, x, y):
        h = ScaledSwish.apply(self.first(x), 0.5, 1)
        if self.in_place:
            h = AddOneInPlace.apply(h * 1.0)
        relu, square = ReluAndSquare.apply(h)
        return torch.nn.functional.mse_loss(self.second(relu + 0.05 * square), y)


def _python_ops(graph) -> set[str]:
    names = set()
    for node in graph.graph.node:
        if node.op_type in ("PythonOp", "PythonOpGrad"):
            names.update(a.s.decode() for a in node.attribute if a.name == "func_name")
    return names


def _steps(net, params, data, steps):
    opt = torch.optim.SGD(params, lr=0.05)
    losses, first_grads = [], None
    for step in range(steps):
        x, y = data[step % len(data)]
        loss = net(x, y)
        loss.backward()
        if step == 0:
            first_grads = [p.grad.clone() for p in params]
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, first_grads


def _data(n=4):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(n)]


def _train_both(model, steps):
    """(reference losses, reference grads, ORT losses, ORT grads, wrapped) from the same start."""
    reference = copy.deepcopy(model)
    wrapped = wrap_model(model, STRICT)
    wrapped.train()
    data = _data()
    ref_losses, ref_grads = _steps(reference, list(reference.parameters()), data, steps)
    losses, grads = _steps(wrapped, list(model.parameters()), data, steps)
    return ref_losses, ref_grads, losses, grads, wrapped


def test_custom_functions_run_as_pythonop_with_parity():
    torch.manual_seed(0)
    ref_losses, ref_grads, losses, grads, wrapped = _train_both(Net(), 10)
    status = wrapped.engine_status()
    assert status.backend == "ort" and status.pythonop
    ops = _python_ops(wrapped.training_graph())
    assert any("ScaledSwish" in n for n in ops) and any("ReluAndSquare" in n for n in ops), ops
    assert max(abs(a - b) for a, b in zip(ref_losses, losses)) <= 1e-5
    for got, ref in zip(grads, ref_grads):
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-5)


def test_in_place_custom_function_trains():
    # ORT's as-shipped dirty-tensor check never saw mark_dirty; the port fixes it.
    torch.manual_seed(0)
    ref_losses, _, losses, _, wrapped = _train_both(Net(in_place=True), 5)
    assert wrapped.engine_status().backend == "ort"
    # The +1 shifts make these losses large (~1e2): compare relatively.
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_two_thousand_pythonop_steps_do_not_leak():
    torch.manual_seed(0)
    model = Net()
    wrapped = wrap_model(model, STRICT)
    wrapped.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _data(1)[0]
    warm = None
    for step in range(2000):
        wrapped(x, y).backward()
        opt.step()
        opt.zero_grad()
        if step == 199:
            warm = _rss_mb()
    assert wrapped.engine_status().backend == "ort"
    growth = (_rss_mb() - warm) / warm
    assert growth < 0.05, f"RSS grew {100 * growth:.1f}% after warm-up"


class ThreadProbe(torch.autograd.Function):
    """Identity that records PyTorch's thread count when ORT calls it (forward and backward)."""

    seen: list[tuple[str, int]] = []

    @staticmethod
    def forward(ctx, x):
        ThreadProbe.seen.append(("forward", torch.get_num_threads()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ThreadProbe.seen.append(("backward", torch.get_num_threads()))
        return grad


class ProbeNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(16, 32)
        self.second = torch.nn.Linear(32, 4)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.second(ThreadProbe.apply(self.first(x))), y)


@pytest.mark.parametrize("setting,inside", [(None, 1), (0, 2), (2, 2)])
def test_pytorch_threads_while_ort_runs(setting, inside):
    """On CPU, PyTorch runs with one thread inside ORT's graph runs by default (its OpenMP
    workers would otherwise spin on ORT's cores), and gets its own setting back afterwards."""
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = ProbeNet()
        wrapped = wrap_model(model, ORTOptions(fallback="disable", log_level="ERROR", torch_threads_in_graph=setting))
        wrapped.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in _data(2):
            ThreadProbe.seen.clear()
            wrapped(x, y).backward()
            opt.step()
            opt.zero_grad()
            assert torch.get_num_threads() == 2  # restored after forward and backward
        assert wrapped.engine_status().backend == "ort"
        assert any("ThreadProbe" in n for n in _python_ops(wrapped.training_graph()))
        # The last step ran only ORT's session (export and its PyTorch passes were in the first).
        assert ThreadProbe.seen == [("forward", inside), ("backward", inside)]
        assert wrapped.session_threading()["torch_threads"] == (inside if setting != 0 else None)
    finally:
        torch.set_num_threads(before)
