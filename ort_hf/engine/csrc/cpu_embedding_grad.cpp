// The embedding gradient of ORT's CPU training graphs, run by ORT's ATen node in place of
// aten::embedding_backward (see ort_hf/engine/cpu_kernel_swaps.py).
//
// The gradient is dense: a vocabulary-sized tensor (47 MB for BERT's 30,522 x 384), written new
// every step. A block that large is above glibc's mmap threshold, so each step maps fresh pages
// and faults every one of them in while zeroing it: 35 ms for that block on one of this
// project's EPYC cores, against 3.5 ms to zero a block already mapped. So each call writes into
// a buffer kept from an earlier call when nothing holds that buffer any more (the gradient it
// carried was released, e.g. by zero_grad(set_to_none=True)); otherwise it takes a new one. The
// sums are torch's: rows in index order, padding_idx's row left at zero, the same additions in
// the same order as embedding_dense_backward_cpu. Like it, an index outside [0, num_weights)
// adds nothing and is no error (torch splits the rows [0, num_weights) among its threads and
// each adds the indices inside its range only), and no rows or no indices give zeros: the
// swap takes every embedding_backward node, padding elimination's row gathers included.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

constexpr size_t kMaxKept = 8;  // buffers kept for reuse: one per embedding of the models training

std::mutex g_mutex;
std::vector<at::Tensor> g_kept;

// Each call hands out a new tensor on a kept buffer's storage (detach()), so that storage's
// reference count says whether anything still holds a result written into it: a handed-out
// tensor, a view of one, ORT's DLPack wrapper. (The kept tensor's own count does not: PyTorch's
// Python wrapper of a result can outlive the result.)
bool unused(const at::Tensor& kept) { return kept.storage().use_count() == 1; }

at::Tensor zeroed_buffer(int64_t rows, int64_t dim, const at::TensorOptions& options) {
  if (rows == 0 || dim == 0) {
    return at::zeros({rows, dim}, options);  // nothing to reuse; keeps no slot
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& kept : g_kept) {
    if (kept.size(0) == rows && kept.size(1) == dim && kept.scalar_type() == options.dtype() && unused(kept)) {
      std::memset(kept.data_ptr(), 0, kept.nbytes());
      return kept.detach();
    }
  }
  at::Tensor fresh = at::zeros({rows, dim}, options);
  if (g_kept.size() < kMaxKept) {
    g_kept.push_back(fresh);
  } else {  // full: the place of one nobody uses (another shape's, whose model may be gone)
    for (auto& kept : g_kept) {
      if (unused(kept)) {
        kept = fresh;
        break;
      }
    }
  }
  return fresh.detach();
}

// What these kernels sum themselves: a dense float32 CPU gradient, long indices, no frequency scaling.
bool own_sums(const at::Tensor& grad, const at::Tensor& indices, bool scale_grad_by_freq, bool sparse) {
  return !sparse && !scale_grad_by_freq && grad.scalar_type() == at::kFloat && grad.is_cpu() &&
         indices.scalar_type() == at::kLong;
}

// Whether the index `k` adds to a row: inside [0, num_weights) and not padding_idx.
inline bool adds(int64_t k, int64_t padding_idx, int64_t num_weights) {
  return k != padding_idx && k >= 0 && k < num_weights;
}

at::Tensor embedding_dense_grad(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                                int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
  if (!own_sums(grad, indices, scale_grad_by_freq, sparse)) {
    return at::embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, sparse);
  }
  const int64_t dim = grad.size(-1);
  const at::Tensor idx = indices.contiguous();
  const at::Tensor rows = grad.contiguous().view({idx.numel(), dim});
  at::Tensor out = zeroed_buffer(num_weights, dim, grad.options());
  const int64_t* index = idx.data_ptr<int64_t>();
  const float* src = rows.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const int64_t k = index[i];
    if (!adds(k, padding_idx, num_weights)) {
      continue;
    }
    float* row = dst + k * dim;
    const float* g = src + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      row[j] += g[j];
    }
  }
  return out;
}

// base += embedding_backward(grad, indices, ...), in place, returning base: a tied table's gradient
// (a head's weight gradient plus the embedding's) without the vocabulary-sized zeroed buffer and
// the full-size sum. The values are that sum's bit for bit: each row's contributions are summed
// first, from zero, in index order (as embedding_dense_grad sums them), then added to base's row.
// What embedding_dense_grad leaves to aten, and a base of another layout, add aten's gradient. The
// caller owns `base`: cpu_tied_embedding_grad.py rewrites only a sum whose operand nothing else reads.
at::Tensor& embedding_dense_grad_add_(at::Tensor& base, const at::Tensor& grad, const at::Tensor& indices,
                                      int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq,
                                      bool sparse) {
  const int64_t dim = grad.dim() > 0 ? grad.size(-1) : 0;
  if (!own_sums(grad, indices, scale_grad_by_freq, sparse) || base.scalar_type() != at::kFloat || !base.is_cpu() ||
      !base.is_contiguous() || base.dim() != 2 || base.size(0) != num_weights || base.size(1) != dim) {
    return base.add_(at::embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq, sparse));
  }
  const at::Tensor idx = indices.contiguous();
  const at::Tensor rows = grad.contiguous().view({idx.numel(), dim});
  const int64_t* index = idx.data_ptr<int64_t>();
  std::vector<int64_t> order;  // the positions that add something, grouped by row, in index order
  order.reserve(idx.numel());
  for (int64_t i = 0; i < idx.numel(); ++i) {
    if (adds(index[i], padding_idx, num_weights)) {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(), [index](int64_t a, int64_t b) { return index[a] < index[b]; });
  const float* src = rows.data_ptr<float>();
  float* dst = base.data_ptr<float>();
  std::vector<float> sum(dim);
  for (size_t start = 0; start < order.size();) {
    const int64_t k = index[order[start]];
    std::fill(sum.begin(), sum.end(), 0.0f);
    size_t end = start;
    for (; end < order.size() && index[order[end]] == k; ++end) {
      const float* g = src + order[end] * dim;
      for (int64_t j = 0; j < dim; ++j) {
        sum[j] += g[j];
      }
    }
    float* row = dst + k * dim;
    for (int64_t j = 0; j < dim; ++j) {
      row[j] += sum[j];
    }
    start = end;
  }
  return base;
}

// Drop the kept buffers (those in use live on with their holders): when a model is gone.
void release_embedding_grad_buffers() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kept.clear();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("embedding_dense_grad(Tensor grad, Tensor indices, int num_weights, int padding_idx, "
        "bool scale_grad_by_freq, bool sparse) -> Tensor");
  m.def("embedding_dense_grad_add_(Tensor(a!) base, Tensor grad, Tensor indices, int num_weights, "
        "int padding_idx, bool scale_grad_by_freq, bool sparse) -> Tensor(a!)");
  m.def("release_embedding_grad_buffers() -> ()", release_embedding_grad_buffers);  // no tensor: every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) {
  m.impl("embedding_dense_grad", embedding_dense_grad);
  m.impl("embedding_dense_grad_add_", embedding_dense_grad_add_);
}
