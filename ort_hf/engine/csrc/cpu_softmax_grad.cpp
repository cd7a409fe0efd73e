// The gradient of softmax (every attention's probabilities): ORT's CPU SoftmaxGrad_13 is three to
// four times slower than PyTorch's vectorised _softmax_backward_data on attention shapes
// (ort_hf/engine/cpu_grad_swaps.py). ORT's ATen node passes no ScalarType (that kernel's
// last argument), so this op fixes it to the output's own type.
//
// Its result is as large as the attention probabilities (64 MB for 8 x 8 heads x 512 x 512), so
// it is written into a kept buffer (kept_buffers.h).

#include <ATen/ATen.h>
#include <torch/library.h>

#include "kept_buffers.h"

namespace {

ort_hf::KeptBuffers g_buffers(2);  // the attention layers' gradients come one at a time

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim) {
  at::Tensor result = g_buffers.like(output);
  at::_softmax_backward_data_out(result, grad, output, dim, output.scalar_type());
  return result;
}

// Drop the kept buffers (those in use live on with their holders): when a model is gone.
void release_softmax_grad_buffers() { g_buffers.release(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("softmax_backward(Tensor grad, Tensor output, int dim) -> Tensor");
  m.def("release_softmax_grad_buffers() -> ()", release_softmax_grad_buffers);  // no tensor: every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("softmax_backward", softmax_backward); }
