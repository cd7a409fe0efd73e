// PyTorch's intra-op threads for one call of an ort_hf kernel inside ORT's graph, which gives
// PyTorch one thread (ORTOptions.torch_threads_in_graph): `wanted` (PyTorch's count outside the
// graph) for the guard's lifetime, the count before restored after.

#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

namespace ort_hf {

struct ThreadsFor {
  int outside;
  explicit ThreadsFor(int64_t wanted) : outside(at::get_num_threads()) {
    if (wanted > outside) at::set_num_threads(static_cast<int>(wanted));
  }
  ~ThreadsFor() {
    if (at::get_num_threads() != outside) at::set_num_threads(outside);
  }
};

}  // namespace ort_hf
