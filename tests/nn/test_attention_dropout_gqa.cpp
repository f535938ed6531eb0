// scaled_dot_product_attention's dropout inside the fused CPU kernel (the mask as the output
// shows it with v the identity, across tiles, heads, samples and threads, values and gradients
// against the composition with that mask, gradcheck) and grouped-query attention (enable_gqa)
// against key and value repeated by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>

#include "attention_test_util.h"

using gw::Tensor;
namespace F = gw::nn::functional;
using nn_test::randn64;
using nn_test::rel_error;
using Inputs = std::vector<Tensor>;
using namespace attention_test;

TEST_CASE("fused attention's dropout drops each probability with p and scales the rest",
          "[nn][attention]") {
  // With v the identity, the output is the probabilities after dropout, P ∘ Z: each 0 or
  // P / (1 - p). Three blocks of query rows and two of keys (the kernel's tiles: 32 and 64).
  gw::Generator gen(13);
  constexpr int64_t kB = 2, kH = 3, kL = 70, kS = 100;
  const double scale = 1 / std::sqrt(8.0);
  const Tensor q = randn64({kB, kH, kL, 8}, gen, false), k = randn64({kB, kH, kS, 8}, gen, false);
  const Tensor eye = gw::eye(kS, gw::TensorOptions(gw::kFloat64)).expand({kB, kH, kS, kS});
  const Tensor probs = attention_in_full(q, k, eye, {}, scale);
  constexpr double p = 0.3;
  gw::manual_seed(5);
  const Tensor dropped = F::scaled_dot_product_attention(q, k, eye, {}, p);
  const Tensor kept = gw::ne(dropped, 0.0);
  CHECK(rel_error(gw::where(kept, probs / (1 - p), gw::zeros({}, gw::kFloat64)), dropped) < 1e-12);
  // About p of them dropped: 42000 draws, a standard deviation of 0.0022; 0.02 is nine.
  const double fraction = 1 - kept.to(gw::kFloat64).mean().item<double>();
  CHECK(std::abs(fraction - p) < 0.02);
  // Every head and every sample draws its own mask.
  CHECK_FALSE(gw::equal(kept.select(1, 0), kept.select(1, 1)));
  CHECK_FALSE(gw::equal(kept.select(0, 0), kept.select(0, 1)));
  // The same seed draws the same mask, another another.
  gw::manual_seed(5);
  CHECK(gw::equal(F::scaled_dot_product_attention(q, k, eye, {}, p), dropped));
  CHECK_FALSE(gw::equal(F::scaled_dot_product_attention(q, k, eye, {}, p), dropped));
  // Whatever the threads: the mask is a function of the seed and the element's place.
  const int threads = gw::get_num_threads();
  gw::set_num_threads(3);
  gw::manual_seed(5);
  const Tensor threaded = F::scaled_dot_product_attention(q, k, eye, {}, p);
  gw::set_num_threads(threads);
  CHECK(gw::equal(threaded, dropped));
  // 16-bit inputs draw the same mask (on float32 copies) as float64.
  gw::manual_seed(5);
  const Tensor half = F::scaled_dot_product_attention(q.to(gw::kBFloat16), k.to(gw::kBFloat16),
                                                      eye.to(gw::kBFloat16), {}, p);
  CHECK(gw::equal(gw::ne(half, 0.0), kept));

  // Values and gradients, causal and not, on four threads: those of (softmax(s) ∘ Z) v with the
  // Z found above (the same seed draws it; causality hides keys, not draws).
  const Tensor z = kept.to(gw::kFloat64) / (1 - p);
  const Tensor v = randn64({kB, kH, kS, 6}, gen, false),
               gout = randn64({kB, kH, kL, 6}, gen, false);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    gw::set_num_threads(4);
    auto fused = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          gw::manual_seed(5);
          return F::scaled_dot_product_attention(a, b, d, {}, p, causal);
        },
        q, k, v, gout);
    gw::set_num_threads(threads);
    auto want = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          Tensor s = gw::matmul(a, b.transpose(-2, -1)) * scale;
          if (causal) s = s + causal_bias(kL, kS);
          return gw::matmul(gw::softmax(s, -1) * z, d);
        },
        q, k, v, gout);
    check_same(fused, want, 1e-12);
  }
  // The fused kernel's node, not the composition's.
  CHECK(F::scaled_dot_product_attention(q.detach().requires_grad_(), k, eye, {}, p)
            .grad_fn()
            ->name() == "ScaledDotProductAttentionBackward");
}

TEST_CASE("gradcheck: fused attention's dropout, causal and masked", "[nn][attention][gradcheck]") {
  // Each evaluation draws the same mask (the generator seeded again), so the function is
  // deterministic and its derivative is the backward's, which draws the mask again from the
  // seed it kept.
  gw::Generator gen(9);
  Tensor q = randn64({2, 2, 6, 4}, gen), k = randn64({2, 2, 7, 4}, gen);
  Tensor v = randn64({2, 2, 7, 3}, gen);
  NN_GRADCHECK(
      [](const Inputs& in) {
        gw::manual_seed(21);
        return F::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.4, true);
      },
      Inputs{q, k, v});
  Tensor mask = gw::gt(gw::rand({6, 7}, gen), 0.3);
  NN_GRADCHECK(
      [mask](const Inputs& in) {
        gw::manual_seed(22);
        return F::scaled_dot_product_attention(in[0], in[1], in[2], mask, 0.4);
      },
      Inputs{q, k, v});
}

TEST_CASE("grouped-query attention: each key and value head serves a group of query heads",
          "[nn][attention]") {
  // Six query heads over two key/value heads: query head j reads head j / 3, as the same
  // attention with key and value repeated (repeat_interleave) gives; the gradients of key and
  // value sum over their group.
  gw::Generator gen(15);
  const Tensor q = randn64({2, 6, 9, 4}, gen, false), k = randn64({2, 2, 11, 4}, gen, false);
  const Tensor v = randn64({2, 2, 11, 3}, gen, false), gout = randn64({2, 6, 9, 3}, gen, false);
  auto repeated = [](const Tensor& t) {
    std::vector<Tensor> heads;
    for (int64_t j = 0; j < 6; ++j) heads.push_back(t.narrow(1, j / 3, 1));
    return gw::cat(heads, 1);
  };
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    auto grouped = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          return F::scaled_dot_product_attention(a, b, d, {}, 0.0, causal, std::nullopt, true);
        },
        q, k, v, gout);
    auto want = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          return F::scaled_dot_product_attention(a, repeated(b), repeated(d), {}, 0.0, causal);
        },
        q, k, v, gout);
    check_same(grouped, want, 1e-12);
    CHECK(grouped[2].sizes() == k.sizes());
  }
  // As many heads everywhere: plain attention. Heads that do not divide the query's are refused
  // naming them, and without enable_gqa any difference, as before.
  CHECK(gw::equal(F::scaled_dot_product_attention(q, k.narrow(1, 0, 1).expand({2, 6, 11, 4}),
                                                  v.narrow(1, 0, 1).expand({2, 6, 11, 3}), {}, 0.0,
                                                  false, std::nullopt, true),
                  F::scaled_dot_product_attention(q, k.narrow(1, 0, 1).expand({2, 6, 11, 4}),
                                                  v.narrow(1, 0, 1).expand({2, 6, 11, 3}))));
  // Key and value heads that each divide the query's (PyTorch's rule: 6 over 1 and 3), a mask
  // of the query's heads and a scale, passed on.
  const Tensor k1 = randn64({2, 1, 11, 4}, gen, false), v3 = randn64({2, 3, 11, 3}, gen, false);
  const Tensor mask = gw::gt(gw::rand({6, 9, 11}, gen), 0.3);
  auto each = [](const Tensor& t, int64_t group) {
    std::vector<Tensor> heads;
    for (int64_t j = 0; j < 6; ++j) heads.push_back(t.narrow(1, j / group, 1));
    return gw::cat(heads, 1);
  };
  auto mixed = run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return F::scaled_dot_product_attention(a, b, d, mask, 0.0, false, 0.7, true);
      },
      q, k1, v3, gout);
  auto mixed_want = run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return F::scaled_dot_product_attention(a, each(b, 6), each(d, 2), mask, 0.0, false, 0.7);
      },
      q, k1, v3, gout);
  check_same(mixed, mixed_want, 1e-12);
  const Tensor k4 = randn64({2, 4, 11, 4}, gen, false), v4 = randn64({2, 4, 11, 3}, gen, false);
  refused([&] { F::scaled_dot_product_attention(q, k4, v4, {}, 0.0, false, std::nullopt, true); },
          "heads (4 and 4) must each divide the query's (6)");
  refused([&] { F::scaled_dot_product_attention(q, k, v4, {}, 0.0, false, std::nullopt, true); },
          "(2 and 4)");
  refused(
      [&] {
        F::scaled_dot_product_attention(q, randn64({3, 2, 11, 4}, gen, false),
                                        randn64({3, 2, 11, 3}, gen, false), {}, 0.0, false,
                                        std::nullopt, true);
      },
      "the batch dims differ: query (2,6,9,4), key (3,2,11,4)");
  refused([&] { F::scaled_dot_product_attention(q, k, v); }, "batch and head dims differ");
}
