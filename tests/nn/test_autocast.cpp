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

// layer_norm -> Linear -> GELU -> + a float32 parameter -> masked attention -> + the parameter ->
// Linear -> cross-entropy: every kind of op autocast treats differently, on (2, 4, 16) inputs.
struct AmpNet {
  gw::Generator gen{3};
  std::shared_ptr<gw::nn::Linear> fc1 = std::make_shared<gw::nn::Linear>(16, 32, gen);
  std::shared_ptr<gw::nn::Linear> fc2 = std::make_shared<gw::nn::Linear>(32, 8, gen);
  Tensor shift = gw::randn({32}, gen).requires_grad_();
  Tensor mask = gw::randn({4, 4}, gen);  // additive, float32

  std::vector<Tensor> parameters() const {
    return {fc1->weight, fc1->bias, fc2->weight, fc2->bias, shift};
  }
  void zero_grad() const {
    for (const Tensor& p : parameters()) p.set_grad(Tensor());
  }

  // Where autocast converts, the program written by hand converts with `lower` (to bfloat16)
  // and `widen` (to float32); under autocast both are the identity.
  struct Casts {
    std::function<Tensor(const Tensor&)> lower, widen;
  };
  Tensor loss(const Tensor& x, const Tensor& y, const Casts& c, bool checkpointed = false) const {
    const Tensor n = F::layer_norm(x, {16});
    auto segment = [&](const Tensor& in) {
      return gw::gelu(F::linear(c.lower(in), c.lower(fc1->weight), c.lower(fc1->bias)));
    };
    const Tensor h = checkpointed ? gw::autograd::checkpoint(segment, n) : segment(n);
    const Tensor q = (h + shift).view({2, 4, 2, 16}).transpose(1, 2);  // float32, 2 heads
    const Tensor a =
        F::scaled_dot_product_attention(c.lower(q), c.lower(q), c.lower(q), c.lower(mask));
    const Tensor r = a.transpose(1, 2).reshape({2, 4, 32}) + shift;
    const Tensor logits = F::linear(c.lower(r), c.lower(fc2->weight), c.lower(fc2->bias));
    return F::cross_entropy(c.widen(logits.reshape({8, 8})), y);
  }
};

const AmpNet::Casts amp_as_is{[](const Tensor& t) { return t; }, [](const Tensor& t) { return t; }};
const AmpNet::Casts amp_by_hand{[](const Tensor& t) { return t.to(gw::kBFloat16); },
                                [](const Tensor& t) { return t.to(gw::kFloat32); }};

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
    CHECK(gw::conv2d(x.view({1, 1, 4, 8}), w.view({8, 1, 1, 8})).dtype() == gw::kBFloat16);
    CHECK(F::scaled_dot_product_attention(x.view({1, 4, 8}), x.view({1, 4, 8}), x.view({1, 4, 8}),
                                          w.narrow(1, 0, 4).narrow(0, 0, 4))
              .dtype() == gw::kBFloat16);  // its float32 mask lowered too
    CHECK(gw::dot(x.reshape({-1}), x.reshape({-1})).dtype() == gw::kFloat32);  // not listed
    CHECK(gw::matmul(x.to(gw::kFloat16), w).dtype() == gw::kBFloat16);  // float16 lowered too
    CHECK(F::mse_loss(p, p).dtype() == gw::kFloat32);
    CHECK(F::nll_loss(p, gw::zeros({4}, gw::kInt64)).dtype() == gw::kFloat32);
    CHECK(gw::logsumexp(p, {1}).dtype() == gw::kFloat32);
    CHECK(gw::pow(p, p).dtype() == gw::kFloat32);
    CHECK(gw::mean(p).dtype() == gw::kFloat32);  // built on sum
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
  gw::AutocastState wrong;
  wrong.enabled[static_cast<int>(gw::DeviceType::CPU)] = true;
  wrong.dtype[static_cast<int>(gw::DeviceType::CPU)] = gw::kFloat32;
  CHECK_THROWS_WITH(gw::AutocastGuard(wrong), Catch::Contains("float32"));
  CHECK_FALSE(gw::is_autocast_enabled(gw::DeviceType::CPU));
  gw::AutocastGuard disabled(gw::DeviceType::CPU, gw::kFloat64, false);  // the dtype is ignored
  CHECK(gw::matmul(x, w).dtype() == gw::kFloat32);
}

TEST_CASE("autocast's gradients reach float32 parameters as the hand-cast program's do",
          "[nn][autocast]") {
  AmpNet net;
  gw::Generator gen(5);
  // x wants a gradient: a checkpointed segment records nothing when none of its inputs does.
  const Tensor x = gw::randn({2, 4, 16}, gen).requires_grad_();
  const Tensor y = gw::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});

  const std::vector<Tensor> by_hand = amp_grads(net, net.loss(x, y, amp_by_hand));
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

TEST_CASE(
    "16-bit layer_norm, cross_entropy, GELU and attention on the CPU are float32's "
    "rounded once, forward and backward",
    "[nn][half]") {
  gw::Generator gen(9);
  // Multiples of 1/32 below 8 in magnitude: exact in both 16-bit formats (8 significant bits),
  // so that float32 starts from the very numbers the 16-bit tensors hold.
  auto exact = [&](gw::Shape shape) {
    return gw::clamp(gw::round(gw::randn(std::move(shape), gen) * 32), -255, 255) / 32;
  };
  const Tensor labels = gw::from_vector(std::vector<int64_t>{0, 3, 9, 2, 2, 7}, {6});
  const Tensor mask = exact({5, 7});  // broadcast over batch and heads
  using Inputs = std::vector<Tensor>;
  struct Case {
    const char* name;
    Inputs inputs;
    std::function<Tensor(const Inputs&)> op;
    size_t checked_grads;  // the first ones (an expanded input's gradient is a second sum)
    // 0: equal; else within this of float32's relative to its largest (attention's backward reads
    // its output, which 16 bits hold rounded).
    double grad_tolerance = 0;
  };
  const std::vector<Case> cases{
      {"layer_norm with weight and bias",
       {exact({6, 10}), exact({10}), exact({10})},
       [](const Inputs& t) { return F::layer_norm(t[0], {10}, t[1], t[2]); },
       3},
      {"gelu", {exact({6, 10})}, [](const Inputs& t) { return gw::gelu(t[0]); }, 1},
      {"cross_entropy",
       {exact({6, 10})},
       [&](const Inputs& t) { return F::cross_entropy(t[0], labels, F::Reduction::kNone); },
       1},
      {"attention, keys and values expanded over heads, a broadcast mask",
       {exact({1, 2, 5, 8}), exact({1, 1, 7, 8}), exact({1, 1, 7, 8})},
       [&](const Inputs& t) {
         return F::scaled_dot_product_attention(t[0], t[1].expand({1, 2, 7, 8}),
                                                t[2].expand({1, 2, 7, 8}), mask.to(t[0].dtype()));
       },
       1,
       2e-2},
  };
  for (gw::DType dtype : {gw::kBFloat16, gw::kFloat16}) {
    for (const Case& c : cases) {
      INFO(c.name << " in " << gw::dtype_name(dtype));
      Inputs in16, in32;
      for (const Tensor& t : c.inputs) {
        in16.push_back(t.to(dtype).requires_grad_());
        in32.push_back(t.clone().requires_grad_());
      }
      const Tensor y16 = c.op(in16), y32 = c.op(in32);
      const Tensor up = exact(y32.sizes());
      y16.backward(up.to(dtype));
      y32.backward(up);
      CHECK(y16.dtype() == dtype);
      CHECK(y16.to(gw::kFloat32).to_vector<float>() ==
            y32.to(dtype).to(gw::kFloat32).to_vector<float>());
      for (size_t i = 0; i < c.checked_grads; ++i) {
        INFO("the gradient of input " << i);
        if (c.grad_tolerance > 0)
          CHECK(nn_test::rel_error(in16[i].grad(), in32[i].grad()) < c.grad_tolerance);
        else
          CHECK(in16[i].grad().to(gw::kFloat32).to_vector<float>() ==
                in32[i].grad().to(dtype).to(gw::kFloat32).to_vector<float>());
      }
    }
  }
}
