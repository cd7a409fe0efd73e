// The gradient of softmax (every attention's probabilities): ORT's CPU SoftmaxGrad_13 is two to
// three times slower than PyTorch's vectorised _softmax_backward_data on attention shapes
// (ort_hf/engine/cpu_kernel_swaps.py). ORT's ATen node passes no ScalarType (that kernel's last
// argument), so this op fixes it to the output's own type.

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim) {
  return at::_softmax_backward_data(grad, output, dim, output.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) { m.def("softmax_backward(Tensor grad, Tensor output, int dim) -> Tensor"); }

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("softmax_backward", softmax_backward); }
