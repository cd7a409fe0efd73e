// The gradient of RMSNorm (Llama, Qwen2, Gemma, Phi-3, T5: ORT's SimplifiedLayerNormalization),
// run by ORT's ATen node in place of ORT's CPU SimplifiedLayerNormalizationGrad, which takes
// about as long as PyTorch's whole chain of eager ops for it (ort_hf/engine/cpu_kernel_swaps.py
// has the figures). PyTorch has no CPU kernel of its own for it (aten::_fused_rms_norm_backward
// is CUDA only), hence this one: one pass over each row, vectorised.
//
// With y = x * rstd * w over the last axis of H elements (rstd = 1 / sqrt(mean(x^2) + eps), as
// the forward saved it), per row:
//   dx = rstd * w * dy - x * rstd^3 * sum(dy * w * x) / H
// and dw = sum over rows of dy * x * rstd: summed in float over blocks of rows, the blocks'
// sums in double, so that its rounding does not grow with the number of rows.
//
// dx from 1 MiB up is written into a buffer kept from an earlier call (kept_buffers.h), well below
// the 32 MiB kept_buffers.h keeps from by default: inside ORT's backward, a dx on memory malloc's
// heap hands out again was written two to three times slower from the second step on than the
// same kernel runs outside ORT, and one on a kept buffer, written every step, is not (the SmolLM2
// shape's 60 of them a backward: 334-446 ms against 88-114 on a 2-core AMD EPYC of family 25;
// docs/results/kernel-profiles/amd-epyc-avx512-family25-2cpu/).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include "kept_buffers.h"

#include <tuple>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kBlockRows = 64;  // rows summed in float before their sum joins dw's double sum
ort_hf::KeptBuffers g_buffers(8, 1 << 20);  // a norm's gradient is consumed by the next node

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad, const at::Tensor& input,
                                                     const at::Tensor& weight, const at::Tensor& rstd) {
  TORCH_CHECK(input.device().is_cpu() && input.scalar_type() == at::kFloat, "rms_norm_backward: float32 CPU input");
  TORCH_CHECK(grad.sizes() == input.sizes() && grad.scalar_type() == at::kFloat, "rms_norm_backward: grad as input");
  TORCH_CHECK(input.dim() >= 1, "rms_norm_backward: input of rank >= 1");
  const int64_t H = input.size(-1);
  TORCH_CHECK(weight.numel() == H && weight.scalar_type() == at::kFloat, "rms_norm_backward: weight of H floats");
  const int64_t rows = H == 0 ? 0 : input.numel() / H;
  TORCH_CHECK(rstd.numel() == rows && rstd.scalar_type() == at::kFloat, "rms_norm_backward: one rstd a row");
  const at::Tensor dy_c = grad.contiguous(), x_c = input.contiguous(), w_c = weight.contiguous(),
                   r_c = rstd.contiguous();
  at::Tensor dx = g_buffers.like(x_c);
  const int threads = at::get_num_threads();
  std::vector<double> partial(static_cast<size_t>(threads) * H, 0.0);
  const float* dy = dy_c.data_ptr<float>();
  const float* x = x_c.data_ptr<float>();
  const float* w = w_c.data_ptr<float>();
  const float* r = r_c.data_ptr<float>();
  float* out = dx.data_ptr<float>();
  const int64_t vec_end = H - H % Vec::size();
  at::parallel_for(0, rows, kBlockRows, [&](int64_t begin, int64_t end) {
    double* acc = partial.data() + static_cast<size_t>(at::get_thread_num()) * H;
    std::vector<float> block(H, 0.0f);
    for (int64_t row = begin; row < end; ++row) {
      const float* dyr = dy + row * H;
      const float* xr = x + row * H;
      float* outr = out + row * H;
      const float rs = r[row];
      Vec dot(0.0f);
      int64_t j = 0;
      for (; j < vec_end; j += Vec::size()) {
        dot = at::vec::fmadd(Vec::loadu(dyr + j) * Vec::loadu(w + j), Vec::loadu(xr + j), dot);
      }
      float s = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, dot);
      for (; j < H; ++j) {
        s += dyr[j] * w[j] * xr[j];
      }
      const float c = s * rs * rs * rs / static_cast<float>(H);
      const Vec vrs(rs), vc(c);
      for (j = 0; j < vec_end; j += Vec::size()) {
        const Vec d = Vec::loadu(dyr + j), xv = Vec::loadu(xr + j);
        (vrs * Vec::loadu(w + j) * d - vc * xv).store(outr + j);
        at::vec::fmadd(d * xv, vrs, Vec::loadu(block.data() + j)).store(block.data() + j);
      }
      for (; j < H; ++j) {
        outr[j] = rs * w[j] * dyr[j] - c * xr[j];
        block[j] += dyr[j] * xr[j] * rs;
      }
      if ((row - begin + 1) % kBlockRows == 0 || row + 1 == end) {
        for (int64_t k = 0; k < H; ++k) {
          acc[k] += block[k];
          block[k] = 0.0f;
        }
      }
    }
  });
  at::Tensor dw = at::empty({H}, w_c.options());
  float* dwp = dw.data_ptr<float>();
  for (int64_t k = 0; k < H; ++k) {
    double sum = 0.0;
    for (int t = 0; t < threads; ++t) {
      sum += partial[static_cast<size_t>(t) * H + k];
    }
    dwp[k] = static_cast<float>(sum);
  }
  return {dx.view(input.sizes()), dw.view(weight.sizes())};
}

// Drop the kept buffers (those in use live on with their holders): when a model is gone.
void release_rms_norm_grad_buffers() { g_buffers.release(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def("rms_norm_backward(Tensor grad, Tensor input, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  m.def("release_rms_norm_grad_buffers() -> ()", release_rms_norm_grad_buffers);  // no tensor: every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("rms_norm_backward", rms_norm_backward); }
