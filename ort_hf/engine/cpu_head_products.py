"""The fused chunked LM head's products (``module_with_loss/chunked_lm_loss.py``) on ORT's CPU
MatMul and Gemm (MLAS) instead of PyTorch's ``mm`` (MKL), on the CPUs where MKL runs them more slowly:
the forward product ``X W^T`` on AMD's (:func:`ort_product_wanted`), the hidden states' gradient
``Z W`` (``Z``: a chunk's softmax gradient) on AMD's with AVX512 (:func:`ort_input_grad_wanted`), the
weight's ``Z^T X`` on AMD's with AVX512 of /proc/cpuinfo family 26 (:func:`ort_weight_grad_wanted`).

``scripts/weight_grad_microbench.py --products forward-and-input-grad`` timed the forward product
over 2,048 rows (``docs/results/kernel-profiles/<cpu>/forward-and-input-grad.json``):

- On a 2-core AMD EPYC (AVX2) ORT's is faster: at GPT-2's 50,257 x 384 833 ms against ``mm``'s 1,002,
  at 50,257 x 256 437 against 735, at 49,152 x 576 (1,024 rows) 433 against 562, at 32,768 x 512 500
  against 670, at 32,000 x 384 457 against 485.
- On a 2-core Intel Xeon (AVX512) ``mm`` is: at 50,257 x 384 298 ms against ORT's 438, at 50,257 x
  256 206 against 279, at 49,152 x 576 239 against 282, at 32,768 x 512 266 against 323, at 32,000 x
  384 182 against 237; at 30,522 x 256 ORT's is 7% faster (162 against 175), and even at 37,984 x
  512 (512 rows).

The gradient products, the same files: on the AMD EPYC (AVX2) the weight's is faster on ``mm``
(``weight-grad.json``) and the hidden states' is faster in ORT on some shapes (606 against 649 ms at
50,257 x 384) and slower on others (760 against 586 at 32,768 x 512); on the Intel Xeon both are slower
in ORT at every vocabulary. On a 2-core AMD EPYC with AVX512 ORT's are faster at every vocabulary: the
hidden states' in about half the time (188 against 409 ms at 50,257 x 384, 77 against 173 at 30,522 x
256), the weight's in 12% to 33% less time but at 32,768 x 512 (402 against 372). In training there,
the gradient products on ORT's against on ``mm``, ORT's median step (``scripts/paired_option_steps.py
--option cpu_lm_head_input_grad_swap,cpu_lm_head_weight_grad_swap``;
``docs/results/head-grad-products/amd-epyc-avx512-2cpu/``): the bench's ``clm`` 861 to 711 ms,
``clm-gpt2`` 1541 to 1113, held-out Llama 6 x 384 1849 to 1622, Mistral 4 x 512 2093 to 1833, GPT-2
6 x 384 2181 to 1997. That EPYC is of /proc/cpuinfo family 26. On one of family 25 with AVX512 the
two together are also the faster on ORT's (``clm`` 1339 to 1215 ms, ``clm-gpt2`` 1915 to 1852;
``head-grad-products/amd-epyc-avx512-family25-2cpu/``), but ``mm`` runs a head's weight gradient
alone in 1.10x to 1.24x less time (``kernel-profiles/amd-epyc-avx512-family25-2cpu/``), and in
training the weight's alone on ``mm`` is level or faster: ORT's median step 1258 to 1245 ms on
``clm``, 1952 to 1932 on ``clm-gpt2``, 2583 to 2479 on the held-out Llama, 3063 to 3051 on the
held-out GPT-2 (``--option cpu_lm_head_weight_grad_swap``;
``head-weight-grad/amd-epyc-avx512-family25-2cpu/``). So the weight's runs on ORT's Gemm on family
26 only, where it was measured faster; an AMD AVX512 family not measured gets ``mm``.

The weight's gradient is summed over the chunks: the first chunk's ``Gemm(Z, X, transA=1)`` writes it,
each later one's ``Gemm(Z, X, G, transA=1)`` adds to it, its output bound to the memory of its input
``G``. ORT 1.19.2's CPU Gemm (``gemm.cc: ComputeGemm``) first copies ``C`` into ``Y``
(``GemmBroadcastBias``: an element-wise copy, here onto itself), then runs MLAS's Gemm with ``beta``
1 over ``Y``: the sum, in place.

One ORT inference session per product and weight shape (the forward's ``MatMul(x, Transpose(w))``,
which ORT fuses into one ``FusedMatMul``), its inputs and output bound to the tensors' own memory (no copy), ``threads`` intra-op
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

import torch

from .._cpuinfo import cpu_family, cpuinfo_field

# /proc/cpuinfo's vendor_id of the CPUs where the forward product was measured faster on ORT's MatMul
ORT_PRODUCT_VENDORS = frozenset({"AuthenticAMD"})
# (/proc/cpuinfo's vendor_id, torch.backends.cpu.get_cpu_capability()) of the CPUs where ORT's Gemm
# was measured faster than PyTorch's mm at the layers' weight gradients (cpu_weight_grad.py), and ORT's
# MatMul at the head's hidden-state gradient (the module docstring)
ORT_GEMM_CPUS = frozenset({("AuthenticAMD", "AVX512")})
# /proc/cpuinfo's cpu family of the ORT_GEMM_CPUS where ORT's Gemm was measured faster than mm at the
# head's weight gradient: not family 25's AVX512 EPYC (the module docstring)
ORT_HEAD_WEIGHT_GRAD_FAMILIES = frozenset({26})


@cache
def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo (``GenuineIntel``, ``AuthenticAMD``), "" where there is none."""
    return cpuinfo_field("vendor_id") or ""


def ort_product_wanted(asked: bool | None, vendor: str | None = None) -> bool:
    """Whether the head's forward product runs on ORT's MatMul: as ``asked``
    (``ORTOptions.cpu_lm_head_forward_swap``), else on the CPUs of :data:`ORT_PRODUCT_VENDORS` only,
    where it was measured faster (the module docstring); elsewhere on PyTorch's ``mm``, as eager."""
    return as_asked_or_on(asked, ORT_PRODUCT_VENDORS, vendor)


def ort_input_grad_wanted(asked: bool | None, vendor: str | None = None, capability: str | None = None) -> bool:
    """Whether the head's hidden-state gradient ``Z W`` runs on ORT's MatMul: as ``asked``
    (``ORTOptions.cpu_lm_head_input_grad_swap``), else on the CPUs of :data:`ORT_GEMM_CPUS` (AMD's with
    AVX512; the module docstring); elsewhere on PyTorch's ``mm``, as eager."""
    return on_ort_gemm_cpu(vendor, capability) if asked is None else asked


def ort_weight_grad_wanted(
    asked: bool | None, vendor: str | None = None, capability: str | None = None, family: int | None = None
) -> bool:
    """Whether the head's weight gradient ``Z^T X`` runs on ORT's Gemm: as ``asked``
    (``ORTOptions.cpu_lm_head_weight_grad_swap``), else on the CPUs of :data:`ORT_GEMM_CPUS` of a family
    in :data:`ORT_HEAD_WEIGHT_GRAD_FAMILIES` (``family``: default /proc/cpuinfo's); elsewhere on
    PyTorch's ``mm``, as eager."""
    if asked is not None:
        return asked
    family = cpu_family() if family is None else family
    return on_ort_gemm_cpu(vendor, capability) and family in ORT_HEAD_WEIGHT_GRAD_FAMILIES


def on_ort_gemm_cpu(vendor: str | None = None, capability: str | None = None) -> bool:
    """Whether this CPU (``vendor``, default :func:`cpu_vendor`; ``capability``, default PyTorch's
    ``get_cpu_capability()``) is one of :data:`ORT_GEMM_CPUS`."""
    vendor = cpu_vendor() if vendor is None else vendor
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    return (vendor, capability) in ORT_GEMM_CPUS


def as_asked_or_on(asked: bool | None, vendors: frozenset[str], vendor: str | None = None) -> bool:
    """``asked`` where set, else whether the CPU's vendor (``vendor``, default :func:`cpu_vendor`) is
    one of ``vendors``: the rule of the switches whose default the CPU decides."""
    if asked is not None:
        return asked
    return (cpu_vendor() if vendor is None else vendor) in vendors


class HeadProducts:
    """The head's products on ORT's sessions, for 2-D float32 contiguous CPU tensors, a weight of
    ``(vocab, features)``: ``forward_product(h, weight, out)`` (``out = h @ weight.T``) where ``forward``
    is on, ``input_grad(z, weight, out)`` (``out = z @ weight``) where ``input_grad`` is, and
    ``weight_grad(z, h, out, accumulate)`` (``out = z.T @ h``, or ``out += z.T @ h``) where
    ``weight_grad`` is. Each returns whether it ran; where it did not (switched off, or tensors it cannot
    take as they are), the caller runs PyTorch's ``mm``."""

    def __init__(self, threads: int, forward: bool = True, input_grad: bool = False, weight_grad: bool = False):
        self.threads = max(1, threads)
        self.forward, self.input_grads, self.weight_grads = forward, input_grad, weight_grad
        self._sessions: dict[tuple[str, int, int], object] = {}  # by (product, vocab, features)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """Its key in the fused loss's ``PRODUCTS``; in the module's repr, so in the export cache's key."""
        return (
            f"ort_threads_{self.threads}"
            + "_forward" * self.forward
            + "_input_grad" * self.input_grads
            + "_weight_grad" * self.weight_grads
        )

    def forward_product(self, h: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> bool:
        return self.forward and self._run("forward", weight.shape, {"x": h, "w": weight}, out)

    def input_grad(self, z: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> bool:
        return self.input_grads and self._run("input_grad", weight.shape, {"z": z, "w": weight}, out)

    def weight_grad(self, z: torch.Tensor, h: torch.Tensor, out: torch.Tensor, accumulate: bool) -> bool:
        if not self.weight_grads:
            return False
        if accumulate:  # out is the Gemm's C as well as its Y: the module docstring
            return self._run("weight_grad_add", out.shape, {"z": z, "x": h, "g": out}, out)
        return self._run("weight_grad", out.shape, {"z": z, "x": h}, out)

    def _run(self, product: str, weight_shape, inputs: dict[str, torch.Tensor], out: torch.Tensor) -> bool:
        tensors = (*inputs.values(), out)
        if not all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors):
            return False
        if any(t.numel() == 0 for t in tensors):
            return False  # nothing to multiply: mm writes the empty or zero result
        import numpy as np

        session = self._session(product, *(int(d) for d in weight_shape))
        binding = session.io_binding()
        for name, t in inputs.items():
            binding.bind_input(name, "cpu", 0, np.float32, _dims(t), t.data_ptr())
        binding.bind_output("y", "cpu", 0, np.float32, _dims(out), out.data_ptr())
        session.run_with_iobinding(binding)
        return True

    def _session(self, product: str, vocab: int, features: int):
        key = (product, vocab, features)
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = _build_session(product, vocab, features, self.threads)
            return self._sessions[key]


def _dims(t: torch.Tensor) -> list[int]:
    return [int(d) for d in t.shape]  # ints also while torch's exporter traces the Function's forward


def _graph(product: str, vocab: int, features: int):
    """The product's ONNX graph: inputs named as :class:`HeadProducts` binds them, output ``y``."""
    from onnx import TensorProto, helper

    def value(name, *dims):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))

    if product == "forward":
        nodes = [
            helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "w_t"], ["y"]),
        ]
        inputs, output = [value("x", "rows", features), value("w", vocab, features)], value("y", "rows", vocab)
    elif product == "input_grad":
        nodes = [helper.make_node("MatMul", ["z", "w"], ["y"])]
        inputs, output = [value("z", "rows", vocab), value("w", vocab, features)], value("y", "rows", features)
    else:  # weight_grad, weight_grad_add
        operands = ["z", "x", "g"] if product == "weight_grad_add" else ["z", "x"]
        nodes = [helper.make_node("Gemm", operands, ["y"], transA=1)]
        inputs = [value("z", "rows", vocab), value("x", "rows", features)]
        inputs += [value("g", vocab, features)] if product == "weight_grad_add" else []
        output = value("y", vocab, features)
    return helper.make_graph(nodes, f"ort_hf_head_{product}", inputs, [output])


def _build_session(product: str, vocab: int, features: int, threads: int):
    import onnxruntime as ort
    from onnx import helper

    graph = _graph(product, vocab, features)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
