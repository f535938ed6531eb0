// Autocast (core/autocast.h) on the CPU: which ops run in 16 bits and which in float32, that
// gradients reach float32 parameters as the same program with its casts written by hand gives
// them, and that backward and checkpoint recomputation run in the forward's dtypes.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "autograd/activation_checkpoint.h"
#include "nn_test_util.h"

using gw::Tensor;
namespace F = gw::nn::functional;

namespace {

// layer_norm -> Linear -> GELU -> causal attention -> + a float32 parameter -> Linear ->
// cross-entropy: every kind of op autocast treats differently, on (2, 4, 16) inputs.
struct AmpNet {
  gw::Generator gen{3};
  std::shared_ptr<gw::nn::Linear> fc1 = std::make_shared<gw::nn::Linear>(16, 32, gen);
  std::shared_ptr<gw::nn::Linear> fc2 = std::make_shared<gw::nn::Linear>(32, 8, gen);
  Tensor shift = gw::randn({32}, gen).requires_grad_();

  std::vector<Tensor> parameters() const {
    return {fc1->weight, fc1->bias, fc2->weight, fc2->bias, shift};
  }
  void zero_grad() const {
    for (const Tensor& p : parameters()) p.set_grad(Tensor());
  }

  Tensor attend(const Tensor& h) const {  // (2, 4, 32) as 2 heads of 16
    const Tensor q = h.view({2, 4, 2, 16}).transpose(1, 2);
    return F::scaled_dot_product_attention(q, q, q, {}, 0.0, true)
        .transpose(1, 2)
        .reshape({2, 4, 32});
  }
  // `cast` stands for autocast's conversion where the program writes its casts by hand.
  Tensor loss(const Tensor& x, const Tensor& y, const std::function<Tensor(const Tensor&)>& cast,
              bool checkpointed = false) const {
    const Tensor n = F::layer_norm(x, {16});
    auto segment = [&](const Tensor& in) {
      return gw::gelu(F::linear(cast(in), cast(fc1->weight), cast(fc1->bias)));
    };
    const Tensor h = checkpointed ? gw::autograd::checkpoint(segment, n) : segment(n);
    const Tensor r = attend(h) + shift;
    const Tensor logits = F::linear(cast(r), cast(fc2->weight), cast(fc2->bias));
    return F::cross_entropy(logits.reshape({8, 8}).to(gw::kFloat32), y);
  }
};

Tensor amp_as_is(const Tensor& t) { return t; }
Tensor amp_to_bf16(const Tensor& t) { return t.to(gw::kBFloat16); }

std::vector<Tensor> amp_grads(const AmpNet& net, const Tensor& loss) {
  net.zero_grad();
  loss.backward();
  std::vector<Tensor> g;
  for (const Tensor& p : net.parameters()) g.push_back(p.grad());
  return g;
}

void check_amp_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    CHECK(a[i].dtype() == gw::kFloat32);
    CHECK(a[i].to_vector<float>() == b[i].to_vector<float>());
  }
}

}  // namespace

TEST_CASE("autocast runs products in bfloat16 and norms, softmax and losses in float32",
          "[nn][autocast]") {
  gw::Generator gen(1);
  const Tensor x = gw::randn({4, 8}, gen), w = gw::randn({8, 8}, gen);
  const Tensor x64 = x.to(gw::kFloat64);
  CHECK_FALSE(gw::is_autocast_enabled(gw::DeviceType::CPU));
  {
    gw::AutocastGuard amp(gw::DeviceType::CPU, gw::kBFloat16);
    CHECK(gw::is_autocast_enabled(gw::DeviceType::CPU));
    CHECK_FALSE(gw::is_autocast_enabled(gw::DeviceType::CUDA));
    const Tensor p = gw::matmul(x, w);
    CHECK(p.dtype() == gw::kBFloat16);
    CHECK(gw::gelu(p).dtype() == gw::kBFloat16);  // not listed: the input's dtype
    CHECK((p + x).dtype() == gw::kFloat32);       // promotion with float32
    CHECK(gw::softmax(p, 1).dtype() == gw::kFloat32);
    CHECK(gw::exp(p).dtype() == gw::kFloat32);
    CHECK(gw::pow(p, 2).dtype() == gw::kFloat32);
    CHECK(gw::sum(p).dtype() == gw::kFloat32);
    CHECK(F::layer_norm(p, {8}).dtype() == gw::kFloat32);
    CHECK(F::cross_entropy(p, gw::zeros({4}, gw::kInt64)).dtype() == gw::kFloat32);
    CHECK(gw::matmul(x64, x64.t()).dtype() == gw::kFloat64);  // float64 is left alone
    CHECK(F::linear(x, w).dtype() == gw::kBFloat16);
    // The products are those of the rounded operands.
    CHECK(p.to_vector<float>() ==
          gw::matmul(x.to(gw::kBFloat16), w.to(gw::kBFloat16)).to(gw::kFloat32).to_vector<float>());
    {
      gw::AutocastGuard off(gw::DeviceType::CPU, gw::kBFloat16, false);
      CHECK(gw::matmul(x, w).dtype() == gw::kFloat32);
    }
    CHECK(gw::matmul(x, w).dtype() == gw::kBFloat16);
    gw::AutocastGuard half(gw::DeviceType::CPU, gw::kFloat16);
    CHECK(gw::matmul(x, w).dtype() == gw::kFloat16);
  }
  CHECK_FALSE(gw::is_autocast_enabled(gw::DeviceType::CPU));
  CHECK(gw::matmul(x, w).dtype() == gw::kFloat32);
  CHECK_THROWS_WITH(gw::AutocastGuard(gw::DeviceType::CPU, gw::kFloat64),
                    Catch::Contains("[autocast]") && Catch::Contains("bfloat16 or float16") &&
                        Catch::Contains("float64"));
}

TEST_CASE("autocast's gradients reach float32 parameters as the hand-cast program's do",
          "[nn][autocast]") {
  AmpNet net;
  gw::Generator gen(5);
  // x wants a gradient: a checkpointed segment records nothing when none of its inputs does.
  const Tensor x = gw::randn({2, 4, 16}, gen).requires_grad_();
  const Tensor y = gw::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});

  const std::vector<Tensor> by_hand = amp_grads(net, net.loss(x, y, amp_to_bf16));
  Tensor loss;
  {
    gw::AutocastGuard amp(gw::DeviceType::CPU);
    loss = net.loss(x, y, amp_as_is);
  }
  CHECK(loss.dtype() == gw::kFloat32);
  const std::vector<Tensor> autocast = amp_grads(net, loss);
  check_amp_same(autocast, by_hand);

  SECTION("backward inside the guard runs as outside it") {
    gw::AutocastGuard amp(gw::DeviceType::CPU);
    check_amp_same(amp_grads(net, net.loss(x, y, amp_as_is)), by_hand);
  }
  SECTION("a checkpointed segment is recomputed in the dtypes its forward had") {
    Tensor ck;
    {
      gw::AutocastGuard amp(gw::DeviceType::CPU);
      ck = net.loss(x, y, amp_as_is, /*checkpointed=*/true);
    }
    check_amp_same(amp_grads(net, ck), by_hand);
  }
  SECTION("and close to float32's: bfloat16 keeps 8 bits") {
    const std::vector<Tensor> f32 = amp_grads(net, net.loss(x, y, amp_as_is));
    for (size_t i = 0; i < f32.size(); ++i) {
      INFO("parameter " << i);
      const double err = nn_test::rel_error(autocast[i], f32[i]);
      CHECK(err < 0.05);
      CHECK(err > 1e-6);  // it did compute in 16 bits
    }
  }
}
