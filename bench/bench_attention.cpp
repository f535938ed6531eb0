// Causal self-attention, forward and backward (4 heads, head_dim 64, float32, one thread; batch
// 4 up to L=512, batch 1 for the long sequences): gradwire's fused kernel
// (scaled_dot_product_attention, is_causal) beside, in the same run, the same attention composed
// from matmul and softmax in gradwire (the scores made in full) and in PyTorch 1.13
// (bench/torch_anchor_attention.py; 1.13 has no fused attention). The fused kernel skips the key
// blocks above the diagonal (half the products at L=512), as flash attention does; the compositions
// compute every score and mask them. Then the peak memory either takes beyond its inputs (the CPU
// allocator's peak), by length at batch 1: linear for the fused kernel, quadratic for the
// composition. Eigen's own scratch (the kernel's tiles, GEMM packing: tens of KiB) comes from
// malloc and is not counted. Two rows time the same with dropout 0.1 on the probabilities: inside
// the fused kernel, after the softmax in the compositions.
#include <cmath>
#include <limits>
#include <string>

#include "bench/harness.h"
#include "core/cpu/cpu_allocator.h"
#include "nn/functional.h"

namespace {

constexpr int64_t kHeads = 4, kHeadDim = 64;
struct Size {
  int64_t batch, length;
  double dropout = 0;
  std::string name() const {  // the batch-4 rows keep their first names
    return std::string(dropout > 0 ? "dropout 0.1 " : "") +
           (batch == 4 ? "" : "B=" + std::to_string(batch) + " ") + "L=" + std::to_string(length);
  }
  std::string anchor_case() const {  // batch:length[:dropout], as the anchor takes it
    return std::to_string(batch) + ":" + std::to_string(length) + (dropout > 0 ? ":0.1" : "");
  }
};
constexpr Size kTimed[] = {{4, 128},  {4, 512},      {1, 256},      {1, 1024},
                           {1, 4096}, {4, 512, 0.1}, {1, 1024, 0.1}};
constexpr int64_t kMemoryLengths[] = {256, 1024, 4096};  // at batch 1

// 0 on and below the diagonal, -inf above: is_causal as an additive mask.
gw::Tensor causal_bias(int64_t l) {
  const gw::Tensor i = gw::arange(l, gw::kInt64);
  return gw::masked_fill(gw::zeros({l, l}), gw::gt(i.unsqueeze(0), i.unsqueeze(1)),
                         -std::numeric_limits<double>::infinity());
}

// One case: q, k and v (leaves), an upstream gradient and the causal mask, for length l.
struct Case {
  gw::Tensor q, k, v, gout, bias;
  double dropout;
  Case(Size size, gw::Generator& gen)
      : q(leaf(size, gen)),
        k(leaf(size, gen)),
        v(leaf(size, gen)),
        gout(gw::randn({size.batch, kHeads, size.length, kHeadDim}, gen)),
        bias(causal_bias(size.length)),
        dropout(size.dropout) {}
  static gw::Tensor leaf(Size size, gw::Generator& gen) {
    return gw::randn({size.batch, kHeads, size.length, kHeadDim}, gen).requires_grad_();
  }
  gw::Tensor fused() const {
    return gw::nn::functional::scaled_dot_product_attention(q, k, v, {}, dropout, true);
  }
  gw::Tensor composed() const {
    gw::Tensor s = gw::matmul(q, k.transpose(-2, -1)) * (1 / std::sqrt(double(kHeadDim)));
    gw::Tensor p = gw::softmax(s + bias, -1);
    if (dropout > 0) p = gw::nn::functional::dropout(p, dropout, true);
    return gw::matmul(p, v);
  }
  // Backward from `out`; the leaves' gradients are dropped for the next call.
  void backward(const gw::Tensor& out) {
    out.backward(gout);
    for (gw::Tensor* t : {&q, &k, &v}) t->set_grad({});
  }
  // MiB that forward and backward of `attention` take at their peak beyond what exists before.
  double peak_mib(gw::Tensor (Case::*attention)() const) {
    const size_t base = gw::cpu_memory_stats().allocated_bytes;
    gw::reset_peak_cpu_memory_stats();
    backward((this->*attention)());
    return double(gw::cpu_memory_stats().peak_allocated_bytes - base) / (1 << 20);
  }
};

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  std::string sizes;  // the anchor's cases: batch:length
  bool timed = false;
  for (Size size : kTimed) {
    sizes += " " + size.anchor_case();
    timed |= report.wants("attention", "causal fwd+bwd " + size.name());
  }
  const std::string script = gw::bench::executable_dir() + "/torch_anchor_attention.py " +
                             std::to_string(kHeads) + " " + std::to_string(kHeadDim) + sizes;
  const auto torch_out =
      timed ? gw::bench::run_capture("/usr/bin/python3 " + script + " 2>/dev/null") : std::nullopt;
  gw::Generator gen(0);
  for (Size size : kTimed) {
    const std::string name = "causal fwd+bwd " + size.name();
    if (!report.wants("attention", name)) continue;
    Case c(size, gen);
    auto [fused, composed] = gw::bench::seconds_per_call_pair([&] { c.backward(c.fused()); },
                                                              [&] { c.backward(c.composed()); });
    const double us = fused * 1e6;
    const std::string key = size.anchor_case() + "_us";
    const auto torch_us = torch_out ? gw::bench::json_number(*torch_out, key) : std::nullopt;
    if (torch_us) {
      report.add({"attention", name, us, "us", "pytorch 1.13 composed", *torch_us,
                  gw::bench::blas_note(*torch_out)});
    } else {
      report.add(
          {"attention", name, us, "us", "pytorch 1.13 composed", 0, "python3-torch not available"});
    }
    report.add({"attention", name, us, "us", "gradwire composed", composed * 1e6});
  }
  for (int64_t l : kMemoryLengths) {
    const std::string name = "causal fwd+bwd peak memory B=1 L=" + std::to_string(l);
    if (!report.wants("attention", name)) continue;
    Case c({1, l}, gen);
    report.add({"attention", name, c.peak_mib(&Case::fused), "MiB", "gradwire composed",
                c.peak_mib(&Case::composed)});
  }
  return 0;
}
