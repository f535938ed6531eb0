// scaled_dot_product_attention: the fused CPU kernel against softmax(q kᵀ · scale + mask) v
// written out here with core ops, and against PyTorch's (tests/nn/fixtures/make_reference.py),
// values and gradients; MultiheadAttention and a GPT block; finite differences; bad input.
// Dropout inside the kernel and grouped-query attention: test_attention_dropout_gqa.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "attention_test_util.h"
#include "core/cpu/cpu_allocator.h"
#include "optim/adamw.h"

using gw::Tensor;
namespace F = gw::nn::functional;
using nn_test::randn64;
using nn_test::rel_error;
using Inputs = std::vector<Tensor>;
using namespace attention_test;

namespace {

struct Case {
  const char* name;
  int64_t b, h, l, s, e, ev;
};

// PyTorch's values: tests/nn/fixtures/make_reference.py.
const gw::NamedTensors& reference() {
  static const gw::NamedTensors tensors =
      gw::load_safetensors(GW_SOURCE_DIR "/tests/nn/fixtures/reference.safetensors");
  return tensors;
}
Tensor reference_or_none(const std::string& key) {
  auto it = reference().find(key);
  return it == reference().end() ? Tensor() : it->second;
}
Tensor reference_at(const std::string& key) {
  INFO("fixture key " << key);
  Tensor t = reference_or_none(key);
  REQUIRE(t.defined());
  return t;
}

}  // namespace

TEST_CASE("fused attention equals the scores made in full", "[nn][attention]") {
  // More rows and keys than one tile (32 x 64) in some cases, fewer in others.
  const Case cases[] = {{"small", 2, 3, 5, 7, 4, 6},
                        {"one head, long", 1, 1, 70, 130, 8, 8},
                        {"rows > keys", 2, 2, 40, 9, 16, 5},
                        {"head_dim 32: float32 tiles on the CPU GEMM", 1, 2, 45, 100, 32, 24}};
  gw::Generator gen(7);
  for (const Case& c : cases) {
    for (int mode = 0; mode < 4; ++mode) {  // plain, causal, bool mask, float mask
      INFO(c.name << ", mode " << mode);
      Tensor q = randn64({c.b, c.h, c.l, c.e}, gen, false);
      Tensor k = randn64({c.b, c.h, c.s, c.e}, gen, false);
      Tensor v = randn64({c.b, c.h, c.s, c.ev}, gen, false);
      Tensor gout = randn64({c.b, c.h, c.l, c.ev}, gen, false);
      const double scale = 1 / std::sqrt(static_cast<double>(c.e));
      Tensor mask, bias;
      bool causal = false;
      if (mode == 1) {
        causal = true;
        bias = causal_bias(c.l, c.s);
      } else if (mode == 2) {  // (L, S), every row keeps key 0
        mask = gw::logical_or(gw::gt(gw::rand({c.l, c.s}, gen), 0.4),
                              gw::eq(gw::arange(c.s, gw::kInt64), 0));
        bias = gw::where(mask, 0.0, gw::full({}, kNegInf, gw::kFloat64));
      } else if (mode == 3) {  // (B, 1, 1, S): a padding mask's shape
        mask = randn64({c.b, 1, 1, c.s}, gen, false);
        bias = mask;
      }
      auto fused = run(
          [&](const Tensor& a, const Tensor& b, const Tensor& d) {
            return F::scaled_dot_product_attention(a, b, d, mask, 0.0, causal);
          },
          q, k, v, gout);
      auto full = run([&](const Tensor& a, const Tensor& b,
                          const Tensor& d) { return attention_in_full(a, b, d, bias, scale); },
                      q, k, v, gout);
      check_same(fused, full, 1e-12);

      // float32 through the same kernel, to float32's precision.
      auto f32 = [](const Tensor& t) {
        return t.defined() && t.is_floating_point() ? t.to(gw::kFloat32) : t;
      };
      auto fused32 = run(
          [&](const Tensor& a, const Tensor& b, const Tensor& d) {
            return F::scaled_dot_product_attention(a, b, d, f32(mask), 0.0, causal);
          },
          f32(q), f32(k), f32(v), f32(gout));
      check_same(fused32, full, 1e-4);
    }
  }
}

TEST_CASE("attention matches PyTorch's, float64", "[nn][attention][torch]") {
  for (const char* name : {"plain", "causal", "bool_mask", "float_mask"}) {
    INFO(name);
    const std::string p = std::string("attn.") + name + ".";
    const Tensor mask = reference_or_none(p + "mask");
    const bool causal = std::string(name) == "causal";
    auto got = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          return F::scaled_dot_product_attention(a, b, d, mask, 0.0, causal);
        },
        reference_at(p + "q"), reference_at(p + "k"), reference_at(p + "v"),
        reference_at(p + "gout"));
    check_same(got,
               {reference_at(p + "out"), reference_at(p + "grad.q"), reference_at(p + "grad.k"),
                reference_at(p + "grad.v")},
               1e-12);
  }
}

TEST_CASE("MultiheadAttention matches PyTorch's, float64", "[nn][attention][torch]") {
  struct MhaCase {
    const char* name;
    bool batch_first, need_weights, average;
  };
  for (const MhaCase& c :
       {MhaCase{"self_padding", false, true, true},
        MhaCase{"causal_batch_first", true, false, true}, MhaCase{"cross", true, true, false}}) {
    INFO(c.name);
    const std::string p = std::string("mha.") + c.name + ".";
    gw::nn::MultiheadAttention mha(8, 2, {.batch_first = c.batch_first});
    mha.to(gw::kFloat64);
    gw::NamedTensors state;
    for (const auto& [key, t] : reference())
      if (key.rfind(p + "param.", 0) == 0) state[key.substr(p.size() + 6)] = t;
    mha.load_state_dict(state);  // strict: PyTorch's names and shapes
    Tensor query = reference_or_none(p + "query").detach().requires_grad_();
    const bool cross = reference_or_none(p + "kv").defined();
    Tensor kv = cross ? reference_or_none(p + "kv").detach().requires_grad_() : query;
    auto [out, weights] =
        mha.forward(query, kv, kv, reference_or_none(p + "key_padding_mask"), c.need_weights,
                    reference_or_none(p + "attn_mask"), c.average);
    CHECK(rel_error(out, reference_or_none(p + "out")) < 1e-12);
    if (c.need_weights) CHECK(rel_error(weights, reference_or_none(p + "weights")) < 1e-12);
    (out * reference_or_none(p + "gout")).sum().backward();
    CHECK(rel_error(query.grad(), reference_or_none(p + "grad.query")) < 1e-12);
    if (cross) CHECK(rel_error(kv.grad(), reference_or_none(p + "grad.kv")) < 1e-12);
    for (const auto& [name, param] : mha.named_parameters()) {
      INFO(name);
      CHECK(rel_error(param.grad(), reference_or_none(p + "grad." + name)) < 1e-12);
    }
  }
}

TEST_CASE("MultiheadAttention: is_causal, self-attention forward, bad shapes", "[nn][attention]") {
  gw::Generator gen(14);
  gw::nn::MultiheadAttention mha(8, 2, {.batch_first = true}, gen);
  Tensor x = gw::randn({2, 5, 8}, gen);
  std::vector<double> upper(25, 0.0);
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j) upper[size_t(i * 5 + j)] = 1;
  Tensor masked_out = gw::from_vector(upper, {5, 5}).to(gw::kBool);
  Tensor causal = mha.forward(x, x, x, {}, false, {}, true, true).first;
  Tensor with_mask = mha.forward(x, x, x, {}, false, masked_out).first;
  CHECK(rel_error(causal, with_mask) < 1e-6);
  auto [weighted, weights] = mha.forward(x, x, x, {}, true, {}, true, true);
  CHECK(rel_error(weighted, causal) < 1e-6);
  CHECK(gw::equal(weights.narrow(2, 1, 4).narrow(1, 0, 1), gw::zeros({2, 1, 4})));  // row 0
  CHECK(rel_error(mha.forward(x), mha.forward(x, x, x, {}, false).first) < 1e-12);
  CHECK_THROWS_WITH(mha.forward(gw::zeros({2, 5, 6}), x, x), Catch::Contains("E = 8"));
  CHECK_THROWS_WITH(mha.forward(x, x, x, {}, false, gw::zeros({5, 4})),
                    Catch::Contains("attn_mask must be (L, S) = (5, 5)"));
  CHECK_THROWS_WITH(mha.forward(x, x, x, gw::zeros({2, 4}, gw::kBool)),
                    Catch::Contains("key_padding_mask must be (N, S)"));
  CHECK_THROWS_WITH(gw::nn::MultiheadAttention(8, 3), Catch::Contains("multiple of num_heads"));
}

TEST_CASE("MultiheadAttention: per-head masks in PyTorch's order, fully padded samples",
          "[nn][attention]") {
  gw::Generator gen(15);
  gw::nn::MultiheadAttention mha(4, 2, {.batch_first = true}, gen);
  mha.to(gw::kFloat64);
  Tensor x = randn64({2, 3, 4}, gen, false);
  // Mask slice i = n * num_heads + h hides every key but i % 3: that head's weights are 1 there.
  std::vector<double> hide(4 * 3 * 3, 1.0);
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 3; ++r) hide[size_t(i * 9 + r * 3 + i % 3)] = 0;
  Tensor mask = gw::from_vector(hide, {4, 3, 3}).to(gw::kBool);
  auto [out, weights] = mha.forward(x, x, x, {}, true, mask, false);
  for (int n = 0; n < 2; ++n)
    for (int h = 0; h < 2; ++h) {
      INFO("sample " << n << ", head " << h);
      CHECK(gw::equal(weights.select(0, n).select(0, h).select(1, (n * 2 + h) % 3),
                      gw::ones({3}, gw::kFloat64)));
    }
  CHECK(rel_error(mha.forward(x, x, x, {}, false, mask).first, out) < 1e-12);

  // Sample 1 has every key padded: zeros on both paths, and finite gradients.
  std::vector<double> pad = {0, 0, 1, 1, 1, 1};
  Tensor padding = gw::from_vector(pad, {2, 3}).to(gw::kBool);
  Tensor xg = x.detach().requires_grad_();
  auto [padded, padded_weights] = mha.forward(xg, xg, xg, padding);
  Tensor fused = mha.forward(x, x, x, padding, false).first;
  CHECK(rel_error(padded, fused) < 1e-12);
  CHECK(gw::equal(padded_weights.select(0, 1), gw::zeros({3, 3}, gw::kFloat64)));
  padded.sum().backward();
  CHECK(gw::allclose(xg.grad(), xg.grad()));  // no NaN
  CHECK_THROWS_WITH(mha.forward(x, x, x, {}, true, gw::zeros({3, 3}, gw::kInt64)),
                    Catch::Contains("attn_mask must be bool or floating point"));

  // No keys at all: zero outputs and (N, L, 0) weights on both paths, as PyTorch gives.
  const Tensor none = gw::zeros({2, 0, 4}, gw::kFloat64);
  auto [empty_out, empty_weights] = mha.forward(x, none, none);
  CHECK(empty_weights.sizes() == gw::Shape{2, 3, 0});
  CHECK(rel_error(empty_out, mha.forward(x, none, none, {}, false).first) < 1e-12);
  CHECK(rel_error(empty_out, mha.out_proj->forward(gw::zeros({2, 3, 4}, gw::kFloat64))) < 1e-12);
}

TEST_CASE("a GPT block matches PyTorch's, and so do three AdamW steps of it, float64",
          "[nn][attention][torch]") {
  gw::nn::GPTBlock block(8, 2);
  block.to(gw::kFloat64);
  gw::NamedTensors state;
  for (const auto& [key, t] : reference())
    if (key.rfind("gpt.param.", 0) == 0) state[key.substr(10)] = t;
  block.load_state_dict(state);  // strict: the names are PyTorch's
  Tensor x = reference_at("gpt.x").detach().requires_grad_();
  Tensor out = block.forward(x);
  CHECK(rel_error(out, reference_at("gpt.out")) < 1e-12);
  (out * reference_at("gpt.gout")).sum().backward();
  CHECK(rel_error(x.grad(), reference_at("gpt.grad.x")) < 1e-12);
  for (const auto& [name, param] : block.named_parameters()) {
    INFO(name);
    CHECK(rel_error(param.grad(), reference_at("gpt.grad." + name)) < 1e-12);
  }
  gw::optim::AdamW opt(block.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    (block.forward(reference_at("gpt.x")) * reference_at("gpt.gout")).sum().backward();
    opt.step();
  }
  for (const auto& [name, param] : block.named_parameters()) {
    INFO("after three AdamW steps: " << name);
    const Tensor want = reference_at("gpt.adamw." + name);
    if (name != "attn.in_proj_bias") {
      CHECK(rel_error(param, want) < 1e-12);
      continue;
    }
    // The key bias adds q·b to every score of a row, which softmax ignores: its gradient is 0
    // but for rounding, far below Adam's eps, so those entries move by lr * noise / eps, a
    // different noise on each side; the query and value biases are exact.
    CHECK(rel_error(param.narrow(0, 0, 8), want.narrow(0, 0, 8)) < 1e-12);
    CHECK(rel_error(param.narrow(0, 16, 8), want.narrow(0, 16, 8)) < 1e-12);
    CHECK(rel_error(param.narrow(0, 8, 8), want.narrow(0, 8, 8)) < 1e-6);
  }
}

TEST_CASE("attention takes a scale, unbatched inputs, and a float mask's gradient",
          "[nn][attention]") {
  gw::Generator gen(8);
  Tensor q = randn64({6, 4}, gen, false), k = randn64({9, 4}, gen, false);
  Tensor v = randn64({9, 3}, gen, false), gout = randn64({6, 3}, gen, false);
  auto fused = run(
      [](const Tensor& a, const Tensor& b, const Tensor& d) {
        return F::scaled_dot_product_attention(a, b, d, {}, 0.0, false, 0.3);
      },
      q, k, v, gout);
  auto full = run([](const Tensor& a, const Tensor& b,
                     const Tensor& d) { return attention_in_full(a, b, d, {}, 0.3); },
                  q, k, v, gout);
  check_same(fused, full, 1e-12);

  // A float mask that requires grad gets one: the composition runs, and it matches.
  Tensor bias = randn64({6, 9}, gen);
  Tensor out = F::scaled_dot_product_attention(q, k, v, bias);
  (out * gout).sum().backward();
  Tensor bias_ref = bias.detach().requires_grad_();
  (attention_in_full(q, k, v, bias_ref, 0.5) * gout).sum().backward();
  REQUIRE(bias.grad().defined());
  CHECK(rel_error(bias.grad(), bias_ref.grad()) < 1e-12);
}

TEST_CASE("bfloat16 and float16 attention on the CPU: stored in 16 bits, computed in float32",
          "[nn][attention]") {
  gw::Generator gen(12);
  const Tensor q = randn64({2, 5, 8}, gen, false), k = randn64({2, 7, 8}, gen, false);
  const Tensor v = randn64({2, 7, 4}, gen, false);
  const Tensor mask = gw::gt(gw::rand({5, 7}, gen), 0.3);
  for (gw::DType dtype : {gw::kBFloat16, gw::kFloat16}) {
    INFO(gw::dtype_name(dtype));
    // The inputs rounded to 16 bits, then the float64 reference on those values.
    Tensor q16 = q.to(dtype).requires_grad_(), k16 = k.to(dtype).requires_grad_();
    Tensor v16 = v.to(dtype).requires_grad_();
    const Tensor out = F::scaled_dot_product_attention(q16, k16, v16, mask);
    CHECK(out.dtype() == dtype);
    out.to(gw::kFloat64).sum().backward();
    Tensor qr = q16.detach().to(gw::kFloat64).requires_grad_();
    Tensor kr = k16.detach().to(gw::kFloat64).requires_grad_();
    Tensor vr = v16.detach().to(gw::kFloat64).requires_grad_();
    const Tensor want = F::scaled_dot_product_attention(qr, kr, vr, mask);
    want.sum().backward();
    // Within the output's own rounding (bfloat16 keeps 8 bits: 2^-8 relative).
    CHECK(rel_error(out.to(gw::kFloat64), want) < 1e-2);
    REQUIRE(q16.grad().defined());
    CHECK(q16.grad().dtype() == dtype);
    CHECK(rel_error(q16.grad().to(gw::kFloat64), qr.grad()) < 2e-2);
    CHECK(rel_error(v16.grad().to(gw::kFloat64), vr.grad()) < 2e-2);
  }
}

TEST_CASE("a row whose every key is masked gives zeros, and leaves the gradients finite",
          "[nn][attention]") {
  gw::Generator gen(10);
  Tensor q = randn64({2, 3, 6, 4}, gen, false), k = randn64({2, 3, 8, 4}, gen, false);
  Tensor v = randn64({2, 3, 8, 5}, gen, false), gout = randn64({2, 3, 6, 5}, gen, false);
  std::vector<double> keep(6 * 8, 1.0);
  for (int j = 0; j < 8; ++j) keep[2 * 8 + j] = 0;  // row 2 sees no key
  keep[4 * 8 + 3] = 0;
  Tensor mask = gw::from_vector(keep, {6, 8}).to(gw::kBool);
  Tensor bias = gw::where(mask, 0.0, gw::full({}, kNegInf, gw::kFloat64));
  auto fused = run([&](const Tensor& a, const Tensor& b,
                       const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, mask); },
                   q, k, v, gout);
  // The composition: a float mask that requires grad takes it.
  Tensor trainable = bias.detach().requires_grad_();
  auto composed =
      run([&](const Tensor& a, const Tensor& b,
              const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, trainable); },
          q, k, v, gout);
  check_same(fused, composed, 1e-12);
  CHECK(gw::equal(fused[0].narrow(2, 2, 1), gw::zeros({2, 3, 1, 5}, gw::kFloat64)));
  for (const Tensor& t : fused) CHECK(gw::allclose(t, t));  // no NaN anywhere
  // The other rows are those of the scores made in full.
  Tensor others = gw::cat({fused[0].narrow(2, 0, 2), fused[0].narrow(2, 3, 3)}, 2);
  Tensor in_full = attention_in_full(q, k, v, bias, 0.5);
  CHECK(rel_error(others, gw::cat({in_full.narrow(2, 0, 2), in_full.narrow(2, 3, 3)}, 2)) < 1e-12);
}

TEST_CASE("a row whose every key a finite mask hides averages v, and so do its gradients",
          "[nn][attention]") {
  // finfo.min hides a key without -inf. Where it hides a whole row, the scores are all that
  // number (q kᵀ is lost to rounding), the softmax is 1/S each, and the gradients flow as
  // through any softmax. A log-sum-exp m + log(S) kept as one number would round to m and
  // recompute the probabilities as 1 each in the backward: S times too large.
  gw::Generator gen(11);
  const Tensor q = randn64({2, 2, 5, 4}, gen, false), k = randn64({2, 2, 70, 4}, gen, false);
  const Tensor v = randn64({2, 2, 70, 3}, gen, false), gout = randn64({2, 2, 5, 3}, gen, false);
  for (gw::DType dtype : {gw::kFloat64, gw::kFloat32}) {
    INFO(gw::dtype_name(dtype));
    const double lowest =
        dtype == gw::kFloat64 ? std::numeric_limits<double>::lowest() : -3.4028234663852886e38;
    Tensor bias = gw::zeros({5, 70}, gw::TensorOptions(dtype));
    bias.narrow(0, 1, 1).fill_(lowest);                   // row 1: every key
    bias.narrow(0, 3, 1).narrow(1, 0, 40).fill_(lowest);  // row 3: most keys
    auto as = [&](const Tensor& t) { return t.to(dtype); };
    auto fused =
        run([&](const Tensor& a, const Tensor& b,
                const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, bias); },
            as(q), as(k), as(v), as(gout));
    Tensor trainable = bias.detach().requires_grad_();  // takes the composition
    auto composed =
        run([&](const Tensor& a, const Tensor& b,
                const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, trainable); },
            as(q), as(k), as(v), as(gout));
    check_same(fused, composed, dtype == gw::kFloat64 ? 1e-12 : 1e-5);
    CHECK(rel_error(fused[0].narrow(2, 1, 1), as(v).mean({2}, true).expand({2, 2, 1, 3})) <
          (dtype == gw::kFloat64 ? 1e-12 : 1e-5));
  }
}

TEST_CASE("attention on several threads, causal, masked, strided inputs", "[nn][attention]") {
  gw::Generator gen(11);
  Tensor q = randn64({3, 5, 70, 8}, gen, false), k = randn64({3, 5, 100, 8}, gen, false);
  Tensor v = randn64({3, 5, 100, 6}, gen, false), gout = randn64({3, 5, 70, 6}, gen, false);
  const double scale = 1 / std::sqrt(8.0);
  auto full =
      run([&](const Tensor& a, const Tensor& b,
              const Tensor& d) { return attention_in_full(a, b, d, causal_bias(70, 100), scale); },
          q, k, v, gout);
  const int threads = gw::get_num_threads();
  gw::set_num_threads(4);
  auto fused =
      run([&](const Tensor& a, const Tensor& b,
              const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, {}, 0.0, true); },
          q, k, v, gout);
  gw::set_num_threads(threads);
  check_same(fused, full, 1e-12);
  // Row 5 sees no key of the first block of 64 but some of the second: its running maximum
  // starts at -inf there.
  std::vector<double> keep(70 * 100, 1.0);
  for (int j = 0; j < 64; ++j) keep[5 * 100 + j] = 0;
  Tensor mask = gw::from_vector(keep, {70, 100}).to(gw::kBool);
  auto masked_full = run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return attention_in_full(a, b, d, gw::where(mask, 0.0, gw::full({}, kNegInf, gw::kFloat64)),
                                 scale);
      },
      q, k, v, gout);
  auto masked = run([&](const Tensor& a, const Tensor& b,
                        const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, mask); },
                    q, k, v, gout);
  check_same(masked, masked_full, 1e-12);
  // A dropout probability that rounds to keeping everything keeps everything, exactly.
  auto composed = run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return F::scaled_dot_product_attention(a, b, d, {}, 1e-300, true);
      },
      q, k, v, gout);
  check_same(composed, full, 1e-12);
  // q as a transposed (B, L, H, E) tensor, the layout a multi-head projection produces.
  Tensor q_blhe = q.transpose(1, 2).contiguous().transpose(1, 2);
  REQUIRE_FALSE(q_blhe.is_contiguous());
  auto strided =
      run([&](const Tensor& a, const Tensor& b,
              const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, {}, 0.0, true); },
          q_blhe, k, v, gout);
  check_same(strided, full, 1e-12);
  // All of them so, the upstream gradient too (given to backward as it is): read where they
  // lie, and the output comes back in that layout (MultiheadAttention joins its heads again as
  // a view). In float32 too, with heads wide enough for the CPU GEMM (core/cpu/sgemm.h).
  auto blhe = [](const Tensor& t) { return t.transpose(1, 2).contiguous().transpose(1, 2); };
  auto in_place = [&](const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g0) {
    std::vector<Tensor> leaves;
    for (const Tensor& t : {q0, k0, v0}) leaves.push_back(blhe(t).detach().requires_grad_());
    Tensor out = F::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], {}, 0.0, true);
    CHECK(out.transpose(1, 2).is_contiguous());
    out.backward(blhe(g0));
    return std::vector<Tensor>{out.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
  };
  check_same(in_place(q, k, v, gout), full, 1e-12);
  Tensor q32 = randn64({2, 3, 45, 32}, gen, false), k32 = randn64({2, 3, 100, 32}, gen, false);
  Tensor v32 = randn64({2, 3, 100, 24}, gen, false), g32 = randn64({2, 3, 45, 24}, gen, false);
  auto full32 = run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return attention_in_full(a, b, d, causal_bias(45, 100), 1 / std::sqrt(32.0));
      },
      q32, k32, v32, g32);
  auto f32 = [](const Tensor& t) { return t.to(gw::kFloat32); };
  check_same(in_place(f32(q32), f32(k32), f32(v32), f32(g32)), full32, 1e-4);
  // More batch dims than (B, H): folded into the heads, each with its own mask.
  Tensor bias = randn64({3, 1, 5, 70, 100}, gen, false);
  auto folded = run([&](const Tensor& a, const Tensor& b,
                        const Tensor& d) { return F::scaled_dot_product_attention(a, b, d, bias); },
                    q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), gout.unsqueeze(1));
  for (Tensor& t : folded) t = t.squeeze(1);
  auto folded_full =
      run([&](const Tensor& a, const Tensor& b,
              const Tensor& d) { return attention_in_full(a, b, d, bias.squeeze(1), scale); },
          q, k, v, gout);
  check_same(folded, folded_full, 1e-12);
}

TEST_CASE("fused attention holds no (L x S) matrix, forward or backward", "[nn][attention]") {
  // One head's scores at L = S = 512 in float32: 1 MiB. The fused kernel's extra memory, with
  // dropout or without, is its outputs, gradients and two numbers per row; the composition holds
  // several such matrices (scores, probabilities, their gradients), which the same measurement
  // sees.
  const int64_t l = 512;
  const size_t scores = size_t(l * l) * sizeof(float);
  gw::Generator gen(12);
  auto leaf = [&](int64_t e) { return gw::randn({1, 2, l, e}, gen).requires_grad_(); };
  Tensor q = leaf(16), k = leaf(16), v = leaf(16), gout = gw::randn({1, 2, l, 16}, gen);
  // A float mask that requires grad takes the composition.
  Tensor trainable = gw::zeros({l, l}).requires_grad_();
  enum Run { kFused, kDropout, kComposed };
  auto peak_extra = [&](Run run) {
    const size_t base = gw::cpu_memory_stats().allocated_bytes;
    gw::reset_peak_cpu_memory_stats();
    {
      Tensor out = run == kFused     ? F::scaled_dot_product_attention(q, k, v, {}, 0.0, true)
                   : run == kDropout ? F::scaled_dot_product_attention(q, k, v, {}, 0.1)
                                     : F::scaled_dot_product_attention(q, k, v, trainable);
      out.backward(gout);
    }
    for (Tensor* t : {&q, &k, &v, &trainable}) t->set_grad({});
    return gw::cpu_memory_stats().peak_allocated_bytes - base;
  };
  const size_t fused = peak_extra(kFused), dropout = peak_extra(kDropout);
  const size_t composed = peak_extra(kComposed);
  INFO("fused " << fused << " B, with dropout " << dropout << " B, composed " << composed
                << " B, one head's scores " << scores);
  CHECK(fused < scores);
  CHECK(dropout < scores);
  CHECK(composed > 2 * scores);
}

TEST_CASE("attention without keys, or with head_dim 0, gives what PyTorch gives",
          "[nn][attention]") {
  gw::Generator gen(13);
  Tensor q = randn64({2, 3, 4}, gen), k = randn64({2, 0, 4}, gen), v = randn64({2, 0, 5}, gen);
  Tensor none = F::scaled_dot_product_attention(q, k, v);
  CHECK(gw::equal(none, gw::zeros({2, 3, 5}, gw::kFloat64)));
  none.sum().backward();
  CHECK(gw::equal(q.grad(), gw::zeros({2, 3, 4}, gw::kFloat64)));
  // E = 0: every score is 0, so each row is the mean of v.
  Tensor v2 = randn64({2, 6, 5}, gen, false);
  Tensor mean = F::scaled_dot_product_attention(gw::zeros({2, 3, 0}, gw::kFloat64),
                                                gw::zeros({2, 6, 0}, gw::kFloat64), v2);
  CHECK(rel_error(mean, gw::mean(v2, {1}, true).expand({2, 3, 5})) < 1e-12);
}

TEST_CASE("gradcheck: fused attention, causal and masked", "[nn][attention][gradcheck]") {
  gw::Generator gen(9);
  Tensor q = randn64({2, 3, 4}, gen), k = randn64({2, 5, 4}, gen), v = randn64({2, 5, 3}, gen);
  NN_GRADCHECK(
      [](const Inputs& in) {
        return F::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, true);
      },
      Inputs{q, k, v});
  Tensor mask =
      gw::from_vector(std::vector<double>{1, 0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1}, {3, 5})
          .to(gw::kBool);
  NN_GRADCHECK(
      [mask](const Inputs& in) {
        return F::scaled_dot_product_attention(in[0], in[1], in[2], mask);
      },
      Inputs{q, k, v});
}

TEST_CASE("attention refuses shapes and options that do not fit, naming them", "[nn][attention]") {
  Tensor q = gw::zeros({2, 4, 5, 8}), k = gw::zeros({2, 4, 6, 8}), v = gw::zeros({2, 4, 6, 3});
  refused([&] { F::scaled_dot_product_attention(q, gw::zeros({2, 4, 6, 7}), v); }, "(2,4,6,7)");
  refused([&] { F::scaled_dot_product_attention(q, k, gw::zeros({2, 4, 5, 3})); }, "(2,4,5,3)");
  refused(
      [&] {
        F::scaled_dot_product_attention(q, gw::zeros({2, 3, 6, 8}), v);
      },
      "batch and head");
  refused(
      [&] {
        F::scaled_dot_product_attention(q, k, v, gw::zeros({5, 7}));
      },
      "attn_mask of shape (5,7)");
  refused(
      [&] {
        F::scaled_dot_product_attention(q, k, v, gw::zeros({5, 6}), 0.0, true);
      },
      "not both");
  refused([&] { F::scaled_dot_product_attention(q, k, v, {}, 1.0); }, "dropout_p");
  refused([&] { F::scaled_dot_product_attention(q, k.to(gw::kFloat64), v); }, "one dtype");
}
