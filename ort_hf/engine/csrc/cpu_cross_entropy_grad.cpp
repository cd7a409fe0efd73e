// The gradient of softmax cross-entropy with respect to its scores, from the log-probabilities its
// forward kept: (exp(log_prob) - onehot(label)) * scale, where a row's scale is its label's class
// weight (1 without weights) times dY (reduction none: that row's dY; mean: dY over the labelled
// rows' weight sum, or their count; sum: dY), and a row whose label is ignore_index gets zeros.
// ORT 1.19.2's CPU SoftmaxCrossEntropyLossInternalGrad computes the same in one serial loop, one
// std::exp per element (engine/cpu_kernel_swaps.py has its cost); here the exponential is PyTorch's
// vectorised one (this file is built without vector flags, so ATen's own kernels do the work), on
// `threads` threads (PyTorch's count outside ORT's graph), and at the label ORT's own (exp - 1) * scale.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "kept_buffers.h"
#include "threads_for.h"

namespace {

constexpr int64_t kRowsAtOnce = 8;  // 8 rows of a 32k vocabulary: 1 MB, a core's L2
ort_hf::KeptBuffers g_buffers(2);   // a loss or two a step

at::Tensor softmax_cross_entropy_grad(const at::Tensor& dy, const at::Tensor& log_prob, const at::Tensor& label,
                                      const std::optional<at::Tensor>& weight, int64_t ignore_index, int64_t reduction,
                                      int64_t threads) {
  TORCH_CHECK(log_prob.scalar_type() == at::kFloat, "softmax_cross_entropy_grad: float32 log-probabilities only");
  ort_hf::ThreadsFor guard(threads);
  const int64_t classes = log_prob.size(1);
  // (N, C, d1, ...): the classes last, one row per label, as ORT's kernel transposes them
  const at::Tensor rows_of_classes = log_prob.dim() > 2 ? log_prob.movedim(1, -1) : log_prob;
  const at::Tensor labels = label.reshape({-1}).to(at::kLong);
  const at::Tensor kept = labels.ne(ignore_index);
  const at::Tensor safe = labels.masked_fill(kept.logical_not(), 0);
  at::Tensor scale = weight.has_value() && weight->defined() ? weight->index_select(0, safe) * kept
                                                             : kept.to(log_prob.scalar_type());
  if (reduction == at::Reduction::None) {
    scale = scale * dy.reshape({-1});
  } else {
    at::Tensor factor = dy.reshape({});
    if (reduction == at::Reduction::Mean) {
      const at::Tensor total = scale.sum();
      if (total.item<double>() != 0) factor = factor / total;
    }
    scale = scale * factor;
  }
  const at::Tensor lp = rows_of_classes.reshape({-1, classes}).contiguous();
  const at::Tensor row_scale = scale.contiguous();
  at::Tensor grad = g_buffers.like(lp);  // MLM's 331 x 30,522 labelled rows: 40 MB
  // A few rows at a time, each thread its own: the exponential and the product while they are in cache.
  at::parallel_for(0, lp.size(0), kRowsAtOnce, [&](int64_t begin, int64_t end) {
    at::Tensor out = grad.narrow(0, begin, end - begin);
    at::exp_out(out, lp.narrow(0, begin, end - begin));
    out.mul_(row_scale.narrow(0, begin, end - begin).unsqueeze(1));
  });
  // At the label, ORT's own (exp - 1) * scale; the ignored rows zero.
  const float* src = lp.data_ptr<float>();
  const float* scales = row_scale.data_ptr<float>();
  const bool* keep = kept.data_ptr<bool>();
  const int64_t* target = safe.data_ptr<int64_t>();
  float* dst = grad.data_ptr<float>();
  for (int64_t i = 0; i < lp.size(0); ++i) {
    float* out = dst + i * classes;
    if (keep[i]) {
      out[target[i]] = (std::exp(src[i * classes + target[i]]) - 1.0f) * scales[i];
    } else {
      std::fill(out, out + classes, 0.0f);
    }
  }
  if (log_prob.dim() > 2) grad = grad.reshape(rows_of_classes.sizes()).movedim(-1, 1).contiguous();
  return grad;
}

// Drop the kept buffers (those in use live on with their holders): when a model is gone.
void release_cross_entropy_grad_buffers() { g_buffers.release(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(ort_hf, m) {
  m.def(
      "softmax_cross_entropy_grad(Tensor dy, Tensor log_prob, Tensor label, Tensor? weight, int ignore_index, "
      "int reduction, int threads) -> Tensor");
  m.def("release_cross_entropy_grad_buffers() -> ()", release_cross_entropy_grad_buffers);  // no tensor: every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) { m.impl("softmax_cross_entropy_grad", softmax_cross_entropy_grad); }
