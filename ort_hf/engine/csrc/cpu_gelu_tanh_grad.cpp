// The gradient of the tanh-approximated GELU, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))):
// ORT's FastGelu (GPT-2's gelu_new, gelu_pytorch_tanh), whose CPU gradient kernel FastGeluGrad is a
// serial loop. ORT's ATen node passes tensors, ints, floats and bools but no string, so
// aten::gelu_backward's approximate="tanh" cannot be given to it: this op fixes it
// (ort_hf/engine/cpu_kernel_swaps.py says where it replaces ORT's kernel).

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor gelu_tanh_backward(const at::Tensor& grad, const at::Tensor& input) {
  return at::gelu_backward(grad, input, "tanh");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) { m.def("gelu_tanh_backward(Tensor grad, Tensor input) -> Tensor"); }

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("gelu_tanh_backward", gelu_tanh_backward); }
