// The fused CUDA attention kernel (core/cuda/attention.cu, bfloat16 and float16) against the
// CPU's in float64 on the same rounded inputs, values and gradients; that it is the kernel
// that ran (its autograd node, no (L x S) matrix in device memory); float32 through the
// composition.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <cuda_runtime_api.h>

#include "core/cuda/allocator.h"
#include "core/random.h"
#include "nn/functional.h"
#include "tests/cuda/cuda_test_util.h"

using cuda_test::kGpu;
using gw::Tensor;
namespace F = gw::nn::functional;

namespace {

// max |got - want| over max |want|.
double attention_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> a = got.to(gw::kCPU).to_vector<double>();
  const std::vector<double> b = want.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 0.1);  // gradients that are 0 in theory: absolute
}

struct AttentionCase {
  const char* name;
  int64_t b, h, l, s, e, ev;
  bool causal = false;
  enum Mask { kNone, kFloat, kPadding, kEmptyRow, kLowestRow } mask = kNone;
  bool heads_transposed = false;  // (B, L, H, E) storage, as MultiheadAttention's
};

// The storage of (B, H, len, dim) heads: (B, len, H, dim) when `heads_transposed`. It is
// converted and moved as it lies and viewed as heads last (`as_heads`): a copy would make it
// contiguous, and the kernels would never read strided heads.
Tensor stored_heads(const AttentionCase& c, int64_t len, int64_t dim, gw::Generator& gen) {
  if (c.heads_transposed) return gw::randn({c.b, len, c.h, dim}, gen);
  return gw::randn({c.b, c.h, len, dim}, gen);
}
Tensor as_heads(const AttentionCase& c, const Tensor& stored) {
  return c.heads_transposed ? stored.transpose(1, 2) : stored;
}

Tensor mask_of(const AttentionCase& c, gw::Generator& gen) {
  switch (c.mask) {
    case AttentionCase::kNone:
      return {};
    case AttentionCase::kFloat:  // per head, broadcast over the batch
      return gw::randn({1, c.h, c.l, c.s}, gen);
    case AttentionCase::kPadding: {  // (B, 1, 1, S): the last keys of sample 0 are padding
      Tensor keep = gw::ones({c.b, 1, 1, c.s}, gw::TensorOptions(gw::kBool));
      keep.narrow(0, 0, 1).narrow(3, c.s / 2, c.s - c.s / 2).fill_(false);
      return keep;
    }
    case AttentionCase::kEmptyRow: {  // query row 1 of every head sees no key
      Tensor keep = gw::ones({c.b, 1, c.l, c.s}, gw::TensorOptions(gw::kBool));
      keep.narrow(2, 1, 1).fill_(false);
      return keep;
    }
    case AttentionCase::kLowestRow: {  // query row 1's keys hidden by bfloat16's lowest value
      Tensor add = gw::zeros({c.b, 1, c.l, c.s});
      add.narrow(2, 1, 1).fill_(-3.3895313892515355e38);
      return add;
    }
  }
  return {};
}

// Output and the gradients of q, k and v under the upstream gradient `gout`.
std::vector<Tensor> forward_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& mask, bool causal, const Tensor& gout,
                                     std::string* node = nullptr) {
  std::vector<Tensor> leaves;
  for (const Tensor* t : {&q, &k, &v}) leaves.push_back(t->detach().requires_grad_());
  Tensor out = F::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], mask, 0.0, causal);
  if (node) *node = out.grad_fn()->name();
  out.backward(gout);
  return {out.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
}

}  // namespace

TEST_CASE("fused attention on the GPU matches float64 attention, values and gradients",
          "[cuda][attention]") {
  GW_REQUIRE_CUDA_DEVICE();
  using C = AttentionCase;
  const AttentionCase cases[] = {
      {"causal self-attention, two tiles and a part", 2, 3, 150, 150, 64, 64, true},
      {"one tile exactly, head dim 128", 2, 2, 64, 64, 128, 128},
      {"causal, head dim 128, three tiles", 1, 2, 192, 192, 128, 128, true},
      {"float mask across tiles", 1, 2, 130, 140, 64, 64, false, C::kFloat},
      {"cross-attention, L < S, float mask, head dims 40 and 24", 1, 2, 17, 130, 40, 24, false,
       C::kFloat},
      {"causal with L > S", 2, 2, 130, 70, 32, 32, true},
      {"causal with L < S", 1, 2, 50, 200, 64, 64, true},
      {"padding mask, MultiheadAttention's layout", 2, 4, 70, 70, 32, 32, false, C::kPadding, true},
      {"a row without keys gives zeros", 1, 2, 20, 33, 16, 16, false, C::kEmptyRow},
      {"head dim 20: staged element by element", 2, 2, 33, 65, 20, 20, true},
      {"one query, one key", 1, 1, 1, 1, 8, 8},
      {"a row every key of which the lowest bfloat16 hides averages v", 1, 2, 20, 90, 32, 32, false,
       C::kLowestRow},
  };
  int shared = 0;
  REQUIRE(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) ==
          cudaSuccess);
  const bool big_blocks = shared >= 104 * 1024;  // head dim 128 takes 103.5 KiB
  for (gw::DType dtype : {gw::kBFloat16, gw::kFloat16}) {
    // One rounding of the output is 2^-8 (bfloat16) or 2^-11 (float16) of it; P and dS are
    // rounded too, as in FlashAttention: a few roundings' worth.
    const double tol = dtype == gw::kBFloat16 ? 2e-2 : 4e-3;
    for (const AttentionCase& c : cases) {
      // float16 rounds bfloat16's lowest to -inf: the row without keys again.
      if (c.mask == C::kLowestRow && dtype != gw::kBFloat16) continue;
      INFO(c.name << ", " << gw::dtype_name(dtype));
      gw::Generator gen(17);
      auto rounded = [&](const Tensor& t) { return t.to(dtype); };
      Tensor q = rounded(stored_heads(c, c.l, c.e, gen));
      Tensor k = rounded(stored_heads(c, c.s, c.e, gen));
      Tensor v = rounded(stored_heads(c, c.s, c.ev, gen));
      Tensor gout = rounded(gw::randn({c.b, c.h, c.l, c.ev}, gen));
      Tensor mask = mask_of(c, gen);
      if (mask.defined() && mask.is_floating_point()) mask = rounded(mask);
      auto f64 = [](const Tensor& t) {
        return t.defined() && t.is_floating_point() ? t.to(gw::kFloat64) : t;
      };
      const std::vector<Tensor> want =
          forward_backward(as_heads(c, f64(q)), as_heads(c, f64(k)), as_heads(c, f64(v)), f64(mask),
                           c.causal, f64(gout));
      auto gpu = [](const Tensor& t) { return t.defined() ? t.to(kGpu) : t; };
      std::string node;
      const std::vector<Tensor> got =
          forward_backward(as_heads(c, gpu(q)), as_heads(c, gpu(k)), as_heads(c, gpu(v)), gpu(mask),
                           c.causal, gpu(gout), &node);
      // The fused kernel, not the composition, except for head dims above 64 on GPUs whose
      // blocks get less shared memory than the kernel takes (99 KiB: sm_86, sm_89, sm_120).
      if (std::max(c.e, c.ev) <= 64 || big_blocks)
        CHECK(node == "ScaledDotProductAttentionBackward");
      const char* names[] = {"output", "grad q", "grad k", "grad v"};
      for (size_t i = 0; i < got.size(); ++i) {
        INFO(names[i]);
        CHECK(got[i].dtype() == dtype);
        CHECK(attention_error(got[i], want[i]) < tol);
      }
      if (c.mask == C::kEmptyRow) {
        CHECK(gw::equal(got[0].narrow(2, 1, 1).to(gw::kCPU),
                        gw::zeros({c.b, c.h, 1, c.ev}, gw::TensorOptions(dtype))));
      }
    }
  }
}

TEST_CASE("float32 attention on the GPU composes cuBLAS products and softmax",
          "[cuda][attention]") {
  GW_REQUIRE_CUDA_DEVICE();
  gw::Generator gen(18);
  Tensor q = gw::randn({2, 2, 40, 32}, gen), k = gw::randn({2, 2, 40, 32}, gen);
  Tensor v = gw::randn({2, 2, 40, 32}, gen), gout = gw::randn({2, 2, 40, 32}, gen);
  const std::vector<Tensor> want = forward_backward(q, k, v, {}, true, gout);
  std::string node;
  const std::vector<Tensor> got =
      forward_backward(q.to(kGpu), k.to(kGpu), v.to(kGpu), {}, true, gout.to(kGpu), &node);
  CHECK(node != "ScaledDotProductAttentionBackward");
  for (size_t i = 0; i < got.size(); ++i) CHECK(attention_error(got[i], want[i]) < 1e-5);
}

TEST_CASE("fused attention on the GPU holds no (L x S) matrix, forward or backward",
          "[cuda][attention]") {
  GW_REQUIRE_CUDA_DEVICE();
  // One head's bfloat16 scores at L = S = 2048: 8 MiB. The fused kernel's extra memory is its
  // output, gradients and three numbers per row; the composition holds several
  // (B, H, L, S) matrices, which the same measurement sees.
  const int64_t l = 2048, heads = 2;
  const size_t scores = size_t(l * l) * 2;
  gw::Generator gen(19);
  auto leaf = [&] {
    return gw::randn({1, heads, l, 64}, gen).to(gw::kBFloat16).to(kGpu).requires_grad_();
  };
  Tensor q = leaf(), k = leaf(), v = leaf();
  Tensor gout = gw::randn({1, heads, l, 64}, gen).to(gw::kBFloat16).to(kGpu);
  auto peak_extra = [&](double dropout) {
    gw::cuda::synchronize(0);
    const size_t base = gw::cuda::memory_stats(0).allocated_bytes;
    gw::cuda::reset_peak_memory_stats(0);
    {
      Tensor out = F::scaled_dot_product_attention(q, k, v, {}, dropout, true);
      out.backward(gout);
    }
    for (Tensor* t : {&q, &k, &v}) t->set_grad({});
    gw::cuda::synchronize(0);
    return gw::cuda::memory_stats(0).peak_allocated_bytes - base;
  };
  const size_t fused = peak_extra(0), composed = peak_extra(1e-300);  // dropout: composed
  INFO("fused " << fused << " B, composed " << composed << " B, one head's scores " << scores);
  CHECK(fused < scores);
  CHECK(composed > 2 * scores);
}
