// The gradient of softmax (every attention's probabilities): ORT's CPU SoftmaxGrad_13 is three to
// four times slower than PyTorch's vectorised _softmax_backward_data on attention shapes
// (ort_hf/engine/cpu_grad_swaps.py). ORT's ATen node passes no ScalarType (that kernel's
// last argument), so this op fixes it to the output's own type.
//
// Its result is as large as the attention probabilities (64 MB for 8 x 8 heads x 512 x 512): above
// glibc's largest mmap threshold (32 MB), such a block is mapped anew at each call and every page
// faulted in while written, which cost more than the kernel itself there (55 ms of 75 on one of
// this project's EPYC cores; cpu_embedding_grad.cpp met the same cost). So a result that large is
// written into a buffer kept from an earlier call once nothing holds that buffer any more (ORT
// released the gradient it carried); smaller ones come from malloc's heap, which reuses them.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

namespace {

constexpr size_t kMaxKept = 2;                      // the attention layers' gradients come one at a time
constexpr int64_t kMinKeptBytes = 32 * 1024 * 1024;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit

std::mutex g_mutex;
std::vector<at::Tensor> g_kept;

// As in cpu_embedding_grad.cpp: each call hands out a new tensor on a kept buffer's storage, so
// the storage's reference count says whether anything still holds a result written into it.
bool unused(const at::Tensor& kept) { return kept.storage().use_count() == 1; }

at::Tensor output_buffer(const at::Tensor& like) {
  if (like.nbytes() < static_cast<size_t>(kMinKeptBytes)) {
    return at::empty_like(like, at::MemoryFormat::Contiguous);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& kept : g_kept) {
    if (kept.sizes() == like.sizes() && kept.scalar_type() == like.scalar_type() && unused(kept)) {
      return kept.detach();
    }
  }
  at::Tensor fresh = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
  if (g_kept.size() < kMaxKept) {
    g_kept.push_back(fresh);
  } else {  // full: the place of one nobody uses (another shape's)
    for (auto& kept : g_kept) {
      if (unused(kept)) {
        kept = fresh;
        break;
      }
    }
  }
  return fresh.detach();
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim) {
  at::Tensor result = output_buffer(output);
  at::_softmax_backward_data_out(result, grad, output, dim, output.scalar_type());
  return result;
}

// Drop the kept buffers (those in use live on with their holders): when a model is gone.
void release_softmax_grad_buffers() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kept.clear();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("softmax_backward(Tensor grad, Tensor output, int dim) -> Tensor");
  m.def("release_softmax_grad_buffers() -> ()", release_softmax_grad_buffers);  // no tensor: every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("softmax_backward", softmax_backward); }
