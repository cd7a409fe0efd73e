// The gradient of a linear weight, dY^T X (nn.Linear) or X^T dY (Conv1D): ORT's CPU Gemm (MLAS) is slower than
// PyTorch's at::mm (MKL) there (engine/cpu_weight_grad.py has the figures). ORT's graph
// gives PyTorch one thread (ORTOptions.torch_threads_in_graph); this product takes `threads`
// (PyTorch's count outside the graph) for its duration, as the fused LM head does. A result of 32 MB
// or more (a vocabulary-sized head's: 47 MB for MiniLM's tied decoder, whose fresh pages cost about
// 11,000 page faults a step) is written into a kept buffer (kept_buffers.h), as ORT's Gemm writes
// into its arena: each step's gradient has the shape of the last step's, which the optimizer step
// released.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "kept_buffers.h"
#include "threads_for.h"

namespace {

ort_hf::KeptBuffers g_buffers(4);  // a head's gradient or two a step: tied or untied, input and output embeddings

// a (rows, m), b (rows, n) -> a^T b (m, n): the sum over rows, zeros when there are none.
at::Tensor weight_grad(const at::Tensor& a, const at::Tensor& b, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  const at::Tensor at = a.t();
  at::Tensor out = g_buffers.empty({at.size(0), b.size(1)}, b.options());
  return at::mm_out(out, at, b);
}

// Drop the kept buffers (those in use live on with their holders): when a model is gone.
void release_weight_grad_buffers() { g_buffers.release(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("weight_grad(Tensor a, Tensor b, int threads) -> Tensor");
  m.def("release_weight_grad_buffers() -> ()", release_weight_grad_buffers);  // no tensor: every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("weight_grad", weight_grad); }
