// The gradient of GatherElements (DeBERTa's relative-position attention gathers, torch.gather):
// ORT's CPU GatherElementsGrad is two to three times slower than PyTorch's scatter_add_ into zeros
// on the same shapes (ort_hf/engine/cpu_grad_swaps.py). Indices may be negative in ONNX (counted
// from the end of the axis) and int32; PyTorch's scatter takes neither, so they are mapped first.

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor gather_elements_grad(const at::Tensor& grad, at::IntArrayRef shape, const at::Tensor& indices,
                                int64_t dim) {
  const int64_t axis = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
  TORCH_CHECK(axis >= 0 && axis < static_cast<int64_t>(shape.size()), "gather_elements_grad: axis out of range");
  at::Tensor index = indices.scalar_type() == at::kLong ? indices : indices.to(at::kLong);
  if (index.numel() > 0 && index.min().item<int64_t>() < 0) {
    index = at::where(index < 0, index + shape[axis], index);
  }
  return at::zeros(shape, grad.options()).scatter_add_(axis, index, grad);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("gather_elements_grad(Tensor grad, int[] shape, Tensor indices, int dim) -> Tensor");
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("gather_elements_grad", gather_elements_grad); }
