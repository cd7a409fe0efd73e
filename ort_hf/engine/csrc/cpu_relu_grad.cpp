// The gradient of ReLU (T5's and OPT's feed-forward): ORT's CPU ReluGrad is about six times slower
// than PyTorch's vectorised threshold_backward, which PyTorch's own ReLU gradient runs
// (ort_hf/engine/cpu_grad_swaps.py). ORT's ATen node passes no Scalar (its threshold), so this op
// fixes it at 0.

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor relu_backward(const at::Tensor& grad, const at::Tensor& input) {
  return at::threshold_backward(grad, input, 0);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) { m.def("relu_backward(Tensor grad, Tensor input) -> Tensor"); }

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("relu_backward", relu_backward); }
