"""The fused chunked LM head's forward product ``X W^T`` (``module_with_loss/chunked_lm_loss.py``) on
ORT's CPU MatMul (MLAS) instead of PyTorch's ``mm`` (MKL), on the CPUs where MKL runs a vocabulary's
transposed weight more slowly: AMD's. :func:`ort_product_wanted` decides.

``scripts/weight_grad_microbench.py --products forward-and-input-grad`` timed the forward product
over 2,048 rows (``docs/results/kernel-profiles/<cpu>/forward-and-input-grad.json``):

- On a 2-core AMD EPYC (AVX2) ORT's is faster: at GPT-2's 50,257 x 384 833 ms against ``mm``'s 1,002,
  at 50,257 x 256 437 against 735, at 49,152 x 576 (1,024 rows) 433 against 562, at 32,768 x 512 500
  against 670, at 32,000 x 384 457 against 485.
- On a 2-core Intel Xeon (AVX512) ``mm`` is: at 50,257 x 384 298 ms against ORT's 438, at 50,257 x
  256 206 against 279, at 49,152 x 576 239 against 282, at 32,768 x 512 266 against 323, at 32,000 x
  384 182 against 237; at 30,522 x 256 ORT's is 7% faster (162 against 175), and even at 37,984 x
  512 (512 rows).

The other two products of the head stay on ``mm`` on every CPU: the weight's gradient is faster
there (``weight-grad.json``), and the hidden states' gradient is faster in ORT on some AMD shapes
(606 against 649 ms at 50,257 x 384) and slower on others (760 against 586 at 32,768 x 512), and
slower in ORT at every vocabulary on the Intel Xeon, the same file.

One ORT inference session per weight shape (``MatMul(x, Transpose(w))``, which ORT fuses into one
``FusedMatMul``), its inputs and output bound to the tensors' own memory (no copy), ``threads`` intra-op
threads that do not spin. It runs inside ORT's ``PythonOp`` of the fused loss, while the training
session's own pool waits. A tensor it cannot take as it is (not float32 on the CPU, not contiguous)
goes to ``mm``.

ORT's training build keeps one CPU execution provider per process, made with the options of the
first session created (``orttraining_python_module.cc``: "for CPU, only 1 instance"). This session is
built while the model is traced, before ORTModule's, so the CPU allocator settings here (ORT's
defaults: the arena on, as ORTModule's session asks) are the ones the training session runs with;
an ``enable_cpu_mem_arena`` set on ORTModule's session options alone would be ignored.
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path

import torch

# /proc/cpuinfo's vendor_id of the CPUs where the forward product was measured faster on ORT's MatMul
ORT_PRODUCT_VENDORS = frozenset({"AuthenticAMD"})


@cache
def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo (``GenuineIntel``, ``AuthenticAMD``), "" where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def ort_product_wanted(asked: bool | None, vendor: str | None = None) -> bool:
    """Whether the head's forward product runs on ORT's MatMul: as ``asked``
    (``ORTOptions.cpu_lm_head_forward_swap``), else on the CPUs of :data:`ORT_PRODUCT_VENDORS` only,
    where it was measured faster (the module docstring); elsewhere on PyTorch's ``mm``, as eager."""
    return as_asked_or_on(asked, ORT_PRODUCT_VENDORS, vendor)


def as_asked_or_on(asked: bool | None, vendors: frozenset[str], vendor: str | None = None) -> bool:
    """``asked`` where set, else whether the CPU's vendor (``vendor``, default :func:`cpu_vendor`) is
    one of ``vendors``: the rule of the switches whose default the CPU decides."""
    if asked is not None:
        return asked
    return (cpu_vendor() if vendor is None else vendor) in vendors


class LogitsProduct:
    """``product(h, weight, out)``: ``out = h @ weight.T`` for 2-D float32 CPU tensors."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self._sessions: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()

    def __call__(self, h: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        tensors = (h, weight, out)
        if not all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors):
            torch.mm(h, weight.t(), out=out)
            return
        if h.shape[0] == 0:
            return
        import numpy as np

        session = self._session(*_dims(weight))
        binding = session.io_binding()
        binding.bind_input("x", "cpu", 0, np.float32, _dims(h), h.data_ptr())
        binding.bind_input("w", "cpu", 0, np.float32, _dims(weight), weight.data_ptr())
        binding.bind_output("y", "cpu", 0, np.float32, _dims(out), out.data_ptr())
        session.run_with_iobinding(binding)

    def _session(self, vocab: int, features: int):
        key = (vocab, features)
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = _build_session(vocab, features, self.threads)
            return self._sessions[key]


def _dims(t: torch.Tensor) -> list[int]:
    return [int(d) for d in t.shape]  # ints also while torch's exporter traces the Function's forward


def _build_session(vocab: int, features: int, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "w_t"], ["y"]),
        ],
        "ort_hf_logits_product",
        [
            helper.make_tensor_value_info("x", f, ["rows", features]),
            helper.make_tensor_value_info("w", f, [vocab, features]),
        ],
        [helper.make_tensor_value_info("y", f, ["rows", vocab])],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
