// A linear layer's forward product X W^T and its input's gradient dY W (GPT-2's Conv1D: b + X W and
// dY W^T), on PyTorch's matmul (MKL) where ORT's MatMul, Gemm and FusedMatMul (MLAS) are slower
// (engine/cpu_linear_products.py has the figures). ORT's graph gives PyTorch one thread
// (ORTOptions.torch_threads_in_graph); each product takes `threads` (PyTorch's count outside the
// graph) for its duration, as weight_grad does.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "threads_for.h"

namespace {

// x (..., in), w (out, in) -> x w^T (..., out): nn.Linear's product, without its bias.
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& w, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  return at::matmul(x, w.t());
}

// dy (..., out), w (out, in) -> dy w (..., in): the gradient of nn.Linear's input.
at::Tensor linear_input_grad(const at::Tensor& dy, const at::Tensor& w, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  return at::matmul(dy, w);
}

// x (n, in), w (in, out), b (out) -> b + x w (n, out): GPT-2's Conv1D, as its forward calls it (addmm).
at::Tensor conv1d_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  return at::addmm(b, x, w);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("linear_forward(Tensor x, Tensor w, int threads) -> Tensor");
  m.def("linear_input_grad(Tensor dy, Tensor w, int threads) -> Tensor");
  m.def("conv1d_forward(Tensor x, Tensor w, Tensor b, int threads) -> Tensor");
  m.def("conv1d_input_grad(Tensor dy, Tensor w, int threads) -> Tensor");
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) {
  m.impl("linear_forward", linear_forward);
  m.impl("linear_input_grad", linear_input_grad);
  m.impl("conv1d_forward", conv1d_forward);
  // dy (..., out), w (in, out) -> dy w^T (..., in), the gradient of Conv1D's input: linear_forward's
  // product, under its own name in the graph.
  m.impl("conv1d_input_grad", linear_forward);
}
