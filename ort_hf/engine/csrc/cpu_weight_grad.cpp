// The gradient of a linear weight, dY^T X (nn.Linear) or X^T dY (Conv1D): ORT's CPU Gemm (MLAS) is slower than
// PyTorch's at::mm (MKL) there (engine/cpu_weight_grad.py has the figures). ORT's graph
// gives PyTorch one thread (ORTOptions.torch_threads_in_graph); this product takes `threads`
// (PyTorch's count outside the graph) for its duration, as the fused LM head does.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "threads_for.h"

namespace {

// a (rows, m), b (rows, n) -> a^T b (m, n): the sum over rows, zeros when there are none.
at::Tensor weight_grad(const at::Tensor& a, const at::Tensor& b, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  return at::mm(a.t(), b);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) { m.def("weight_grad(Tensor a, Tensor b, int threads) -> Tensor"); }

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("weight_grad", weight_grad); }
