// PyTorch's CPU flash-attention kernel and its backward as ORT's graph runs them
// (engine/symbolics/flash_attention.py): with `threads` (PyTorch's count outside the graph, which
// gives PyTorch one thread: ORTOptions.torch_threads_in_graph), and causal wherever the mask is.
//
// The graph passes transformers' mask, also for a causal LM, and the kernel then visits every key
// block, where eager SDPA, given no padding, drops the mask and runs with is_causal, skipping the
// blocks above the diagonal. A mask that keeps no key after its query (every element above the
// diagonal -inf) gets is_causal here too. The skipped blocks would add exact zeros (their
// probabilities are exp(-inf)), so the kernel's values are the same bits, with the mask or
// without it, causal or not, and with 1 thread or more: each output row, and each key's gradient,
// is summed by one thread in one order (tests/engine/test_flash_attention.py checks all of it).
//
// The wrappers call the kernel's own entry points (the dispatch stubs PyTorch's operators call)
// with results they allocate themselves: contiguous in the (batch, heads, length, head size)
// layout the graph takes, so ORT's ATen node has no strided result to copy (PyTorch's operators
// return the gradients, and the log-sum-exp, as transposed views), and from 1 MiB up on buffers
// kept from an earlier call, for the reason cpu_rms_norm_grad.cpp gives: on memory malloc's heap
// hands out again, the backward ran two to three times slower from the second step on than in
// the first (docs/results/kernel-profiles/amd-epyc-avx512-family25-2cpu/). The kernel reads
// every result's strides, so the layout changes where it writes, not what. Where the stubs cannot
// be called (engine/extensions.py says when), the wrappers call PyTorch's operators.

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#ifdef ORT_HF_DISPATCH_STUBS  // engine/extensions.py defines it where torch's stubs can be called
#include <ATen/native/transformers/attention.h>
#endif

#include "kept_buffers.h"
#include "threads_for.h"

#include <cmath>
#include <optional>
#include <tuple>

namespace {

// Whether a float mask (..., L, S) with L == S is -inf everywhere above its diagonal.
bool masks_the_future(const std::optional<at::Tensor>& mask) {
  if (!mask.has_value() || !mask->defined() || mask->dim() < 2 || mask->scalar_type() != at::kFloat) return false;
  const int64_t length = mask->size(-2);
  if (length != mask->size(-1)) return false;
  const at::Tensor rows = mask->contiguous().reshape({-1, length, length});
  const float* data = rows.const_data_ptr<float>();
  for (int64_t m = 0; m < rows.size(0); ++m) {
    const float* square = data + m * length * length;
    for (int64_t i = 0; i < length; ++i) {
      for (int64_t j = i + 1; j < length; ++j) {
        const float value = square[i * length + j];
        if (!(std::isinf(value) && value < 0)) return false;
      }
    }
  }
  return true;
}

// A forward's output and log-sum-exp live until its backward: one pair a layer is kept.
ort_hf::KeptBuffers g_forward_buffers(128, 1 << 20);
ort_hf::KeptBuffers g_backward_buffers(16, 1 << 20);  // the gradients are consumed within the layer

// A contiguous (B, H, L, ...) result on a kept buffer, as the (B, L, H, ...) view the kernel writes
// (its forward reads the query, key and value as they are, its backward all of them transposed).
at::Tensor kept_transposed(ort_hf::KeptBuffers& buffers, at::IntArrayRef sizes, const at::TensorOptions& options) {
  return buffers.empty(sizes, options).transpose(1, 2);
}

std::tuple<at::Tensor, at::Tensor> flash_attention(const at::Tensor& query, const at::Tensor& key,
                                                   const at::Tensor& value, double dropout_p, bool is_causal,
                                                   const std::optional<at::Tensor>& attn_mask,
                                                   std::optional<double> scale, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  const bool causal = is_causal || masks_the_future(attn_mask);
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "flash_attention: 4-d query, key and value");
  TORCH_CHECK(dropout_p == 0.0, "flash_attention: no dropout");
#ifdef ORT_HF_DISPATCH_STUBS
  const at::Tensor out_t = kept_transposed(g_forward_buffers, query.sizes(), query.options());
  const at::Tensor lse_t = kept_transposed(g_forward_buffers, query.sizes().slice(0, 3),
                                           query.options().dtype(at::toOpMathType(query.scalar_type())));
  at::native::flash_attention_kernel(at::kCPU, out_t, lse_t, query, key, value, dropout_p, causal, attn_mask, scale);
  return {out_t.transpose(1, 2), lse_t.transpose(1, 2)};
#else
  return at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, causal, attn_mask, scale);
#endif
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& log_sum_exp, double dropout_p, bool is_causal,
    const std::optional<at::Tensor>& attn_mask, std::optional<double> scale, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  const bool causal = is_causal || masks_the_future(attn_mask);
  TORCH_CHECK(grad_out.defined(), "flash_attention_backward: an output gradient");
#ifdef ORT_HF_DISPATCH_STUBS
  const at::Tensor grad_q = kept_transposed(g_backward_buffers, query.sizes(), query.options()).zero_();
  const at::Tensor grad_k = kept_transposed(g_backward_buffers, key.sizes(), key.options()).zero_();
  const at::Tensor grad_v = kept_transposed(g_backward_buffers, value.sizes(), value.options()).zero_();
  // the kernel takes a contiguous output gradient in its layout (or makes one): a kept one
  const at::Tensor grad_out_t = g_backward_buffers.empty(grad_out.transpose(1, 2).sizes(), grad_out.options());
  grad_out_t.copy_(grad_out.transpose(1, 2));
  at::native::flash_attention_backward_kernel(at::kCPU, grad_q, grad_k, grad_v, grad_out_t,
                                              query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                              out.transpose(1, 2), log_sum_exp.transpose(1, 2), dropout_p, causal,
                                              attn_mask, scale);
  return {grad_q.transpose(1, 2), grad_k.transpose(1, 2), grad_v.transpose(1, 2)};
#else
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, log_sum_exp,
                                                                  dropout_p, causal, attn_mask, scale);
#endif
}

void release_flash_attention_buffers() {
  g_forward_buffers.release();
  g_backward_buffers.release();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("release_flash_attention_buffers() -> ()", release_flash_attention_buffers);  // no tensor: every backend
  m.def(
      "flash_attention(Tensor query, Tensor key, Tensor value, float dropout_p, bool is_causal, Tensor? attn_mask, "
      "float? scale, int threads) -> (Tensor, Tensor)");
  m.def(
      "flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
      "Tensor log_sum_exp, float dropout_p, bool is_causal, Tensor? attn_mask, float? scale, int threads) "
      "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) {
  m.impl("flash_attention", flash_attention);
  m.impl("flash_attention_backward", flash_attention_backward);
}
