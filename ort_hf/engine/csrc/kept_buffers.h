// Result buffers kept for reuse by a kernel whose results are large. A result above glibc's largest
// mmap threshold (32 MB) is mapped anew at each call and every page faulted in while written, which
// can cost more than the kernel itself (55 ms of 75 for a softmax gradient on one of this project's
// EPYC cores; cpu_embedding_grad.cpp met the same cost). So such a result is written into a buffer
// kept from an earlier call once nothing holds that buffer any more (ORT released the gradient it
// carried); smaller ones come from malloc's heap, which reuses them.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace ort_hf {

class KeptBuffers {
 public:
  explicit KeptBuffers(size_t max_kept) : max_kept_(max_kept) {}

  // An uninitialised contiguous tensor of `like`'s sizes and type.
  at::Tensor like(const at::Tensor& like) {
    if (like.nbytes() < static_cast<size_t>(kMinKeptBytes)) {
      return at::empty_like(like, at::MemoryFormat::Contiguous);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& kept : kept_) {
      if (kept.sizes() == like.sizes() && kept.scalar_type() == like.scalar_type() && unused(kept)) {
        return kept.detach();
      }
    }
    at::Tensor fresh = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
    if (kept_.size() < max_kept_) {
      kept_.push_back(fresh);
    } else {  // full: the place of one nobody uses (another shape's)
      for (auto& kept : kept_) {
        if (unused(kept)) {
          kept = fresh;
          break;
        }
      }
    }
    return fresh.detach();
  }

  // Drop the kept buffers (those in use live on with their holders): when a model is gone.
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.clear();
  }

 private:
  static constexpr int64_t kMinKeptBytes = 32 * 1024 * 1024;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit

  // As in cpu_embedding_grad.cpp: each call hands out a new tensor on a kept buffer's storage, so
  // the storage's reference count says whether anything still holds a result written into it.
  static bool unused(const at::Tensor& kept) { return kept.storage().use_count() == 1; }

  std::mutex mutex_;
  std::vector<at::Tensor> kept_;
  size_t max_kept_;
};

}  // namespace ort_hf
