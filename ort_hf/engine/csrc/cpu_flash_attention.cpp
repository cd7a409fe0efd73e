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

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

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

std::tuple<at::Tensor, at::Tensor> flash_attention(const at::Tensor& query, const at::Tensor& key,
                                                   const at::Tensor& value, double dropout_p, bool is_causal,
                                                   const std::optional<at::Tensor>& attn_mask,
                                                   std::optional<double> scale, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  const bool causal = is_causal || masks_the_future(attn_mask);
  return at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, causal, attn_mask, scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& log_sum_exp, double dropout_p, bool is_causal,
    const std::optional<at::Tensor>& attn_mask, std::optional<double> scale, int64_t threads) {
  ort_hf::ThreadsFor guard(threads);
  const bool causal = is_causal || masks_the_future(attn_mask);
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, log_sum_exp,
                                                                  dropout_p, causal, attn_mask, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
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
