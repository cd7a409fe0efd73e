// Dropout for ORT's CPU training graphs, run by ORT's ATen node through torch's dispatcher
// (see ort_hf/engine/cpu_kernel_swaps.py for why and where it replaces ORT's kernels).
//
// Same contract as ONNX Dropout / ORT's DropoutGrad in training mode: an element is kept with
// probability 1 - ratio, kept elements are scaled by 1 / (1 - ratio), the mask says which were
// kept. The random bits are counter-based (wyrand's output function of a per-call key plus the
// element pair's index; the key is SplitMix64-mixed from the seed and the call's index since that
// seed was set), so any split of the tensor over threads draws the same mask: set_dropout_seed
// per training step makes every step's masks reproducible (a resumed run draws what an
// uninterrupted one did).

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <tuple>

namespace {

constexpr int64_t kGrain = 16384;                    // element pairs per parallel task

constexpr uint64_t kWyStep = 0xA0761D6478BD642FULL;  // wyrand's increment

// wyrand's output function (one 64x64->128 multiply) of a counter: the draws of a call.
inline uint64_t wyrand(uint64_t s) {
  const __uint128_t t = static_cast<__uint128_t>(s) * (s ^ 0xE7037ED1A0B428DBULL);
  return static_cast<uint64_t>(t >> 64) ^ static_cast<uint64_t>(t);
}

// SplitMix64's finaliser: the per-call key.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::atomic<uint64_t> g_seed{0};
std::atomic<uint64_t> g_calls{0};
std::atomic<bool> g_seeded{false};
std::once_flag g_default_seed;

// A key per call: seeded by set_dropout_seed, else once from torch's default CPU generator (so
// torch.manual_seed makes a run that never sets the seed reproducible too).
uint64_t next_key() {
  if (!g_seeded.load()) {
    std::call_once(g_default_seed, [] {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      uint64_t seed = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
      if (!g_seeded.load()) {
        g_seed.store(seed);
        g_seeded.store(true);
      }
    });
  }
  return mix64(g_seed.load() ^ mix64(g_calls.fetch_add(1) + 1));
}

// Elements below this 32-bit threshold are dropped: P(drop) = threshold / 2^32 = ratio.
inline uint32_t drop_threshold(double ratio) {
  return static_cast<uint32_t>(std::llround(ratio * 4294967296.0));
}

void check_ratio(double ratio) {
  TORCH_CHECK(ratio >= 0.0 && ratio < 1.0, "ort_hf::cpu_dropout: ratio must be in [0, 1), got ", ratio);
}

std::tuple<at::Tensor, at::Tensor> cpu_dropout(const at::Tensor& input, double ratio) {
  TORCH_CHECK(input.device().is_cpu() && input.scalar_type() == at::kFloat,
              "ort_hf::cpu_dropout takes a float32 CPU tensor, got ", input.scalar_type(), " on ", input.device());
  check_ratio(ratio);
  const at::Tensor x = input.contiguous();
  at::Tensor y = at::empty_like(x);
  at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kByte));
  const float* xs = x.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  uint8_t* ms = mask.data_ptr<uint8_t>();
  const int64_t n = x.numel();
  const uint32_t threshold = drop_threshold(ratio);
  const float scale = static_cast<float>(1.0 / (1.0 - ratio));
  const uint64_t key = next_key();
  // One 64-bit draw serves the pair of elements (2j, 2j + 1). Captured by value: the uint8
  // stores may alias anything captured by reference, which would be reloaded every element.
  at::parallel_for(0, (n + 1) / 2, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const uint64_t bits = wyrand(key + static_cast<uint64_t>(j + 1) * kWyStep);
      const int64_t i = 2 * j;
      const uint8_t keep0 = static_cast<uint32_t>(bits) >= threshold;
      ms[i] = keep0;
      ys[i] = xs[i] * (keep0 * scale);  // no branch: the mask is random
      if (i + 1 < n) {
        const uint8_t keep1 = static_cast<uint32_t>(bits >> 32) >= threshold;
        ms[i + 1] = keep1;
        ys[i + 1] = xs[i + 1] * (keep1 * scale);
      }
    }
  });
  return {y, mask};
}

at::Tensor cpu_dropout_grad(const at::Tensor& grad, const at::Tensor& mask, double ratio) {
  TORCH_CHECK(grad.device().is_cpu() && grad.scalar_type() == at::kFloat && mask.scalar_type() == at::kByte &&
                  grad.sizes() == mask.sizes(),
              "ort_hf::cpu_dropout_grad takes a float32 gradient and the uint8 mask of its shape");
  check_ratio(ratio);
  const at::Tensor dy = grad.contiguous();
  const at::Tensor m = mask.contiguous();
  at::Tensor dx = at::empty_like(dy);
  const float* dys = dy.data_ptr<float>();
  const uint8_t* ms = m.data_ptr<uint8_t>();
  float* dxs = dx.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / (1.0 - ratio));
  at::parallel_for(0, dy.numel(), 2 * kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dxs[i] = dys[i] * (ms[i] * scale);
  });
  return dx;
}

void set_dropout_seed(int64_t seed) {
  g_seed.store(static_cast<uint64_t>(seed));
  g_calls.store(0);
  g_seeded.store(true);
}

}  // namespace

TORCH_LIBRARY(ort_hf, m) {
  m.def("cpu_dropout(Tensor input, float ratio) -> (Tensor, Tensor)");
  m.def("cpu_dropout_grad(Tensor grad, Tensor mask, float ratio) -> Tensor");
  m.def("set_dropout_seed(int seed) -> ()", set_dropout_seed);  // no tensor: one kernel for every backend
}

TORCH_LIBRARY_IMPL(ort_hf, CPU, m) {
  m.impl("cpu_dropout", cpu_dropout);
  m.impl("cpu_dropout_grad", cpu_dropout_grad);
}
