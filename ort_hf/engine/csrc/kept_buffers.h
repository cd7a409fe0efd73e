// Result buffers kept for reuse by a kernel whose results are large. A result above glibc's largest
// mmap threshold (32 MB) is mapped anew at each call and every page faulted in while written, which
// can cost more than the kernel itself (55 ms of 75 for a softmax gradient on one of this project's
// EPYC cores; cpu_embedding_grad.cpp met the same cost). So such a result is written into a buffer
// kept from an earlier call once nothing holds that buffer any more (ORT released the value it
// carried), as ORT's own kernels write into its arena; smaller ones come from malloc's heap, unless
// the kernel sets a lower bound (cpu_rms_norm_grad.cpp says why its is 1 MiB). A buffer
// serves any result of its size or up to half its size, of any shape and type, so that results
// whose shape changes from batch to batch (the cross-entropy gradient of an MLM's labelled rows)
// reuse the same buffers.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace ort_hf {

class KeptBuffers {
 public:
  // Keeps up to `max_kept` buffers, for results of at least `min_kept_bytes`.
  explicit KeptBuffers(size_t max_kept, int64_t min_kept_bytes = kMmapThresholdMax)
      : min_kept_bytes_(min_kept_bytes), max_kept_(max_kept) {}

  // An uninitialised contiguous tensor of `like`'s sizes and type.
  at::Tensor like(const at::Tensor& like) { return empty(like.sizes(), like.options()); }

  // An uninitialised contiguous tensor of `sizes` with `options`.
  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
    const int64_t nbytes =
        c10::multiply_integers(sizes) * static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType()));
    const at::TensorOptions contiguous = options.memory_format(at::MemoryFormat::Contiguous);
    if (nbytes < min_kept_bytes_) {
      return at::empty(sizes, contiguous);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    at::Tensor* best = nullptr;  // the smallest unused buffer it fits, within twice its size
    for (auto& kept : kept_) {
      const int64_t capacity = static_cast<int64_t>(kept.nbytes());
      if (unused(kept) && capacity >= nbytes && capacity <= 2 * nbytes &&
          (best == nullptr || capacity < static_cast<int64_t>(best->nbytes()))) {
        best = &kept;
      }
    }
    if (best != nullptr) {
      return at::empty({0}, contiguous).set_(best->storage(), 0, sizes);
    }
    at::Tensor fresh = at::empty({nbytes}, options.dtype(at::kByte));
    if (kept_.size() < max_kept_) {
      kept_.push_back(fresh);
    } else {  // full: the place of the smallest one nobody uses
      at::Tensor* smallest = nullptr;
      for (auto& kept : kept_) {
        if (unused(kept) && (smallest == nullptr || kept.nbytes() < smallest->nbytes())) {
          smallest = &kept;
        }
      }
      if (smallest != nullptr) {
        *smallest = fresh;
      }
    }
    return at::empty({0}, contiguous).set_(fresh.storage(), 0, sizes);
  }

  // Drop the kept buffers (those in use live on with their holders): when a model is gone.
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.clear();
  }

 private:
  // Each call hands out a new tensor on a kept buffer's storage, so the storage's reference count
  // says whether anything still holds a result written into it (as in cpu_embedding_grad.cpp).
  static bool unused(const at::Tensor& kept) { return kept.storage().use_count() == 1; }

  std::mutex mutex_;
  static constexpr int64_t kMmapThresholdMax = 32 * 1024 * 1024;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit

  std::vector<at::Tensor> kept_;  // byte tensors, one a buffer
  int64_t min_kept_bytes_;
  size_t max_kept_;
};

}  // namespace ort_hf
