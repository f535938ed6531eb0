// GradScaler: float16 gradients that would flush to zero come through scaled, overflowing
// steps are skipped and back the scale off, good ones grow it, and misuse is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "core/ops.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

using gw::Tensor;

namespace {

// matmul(x, w).sum() * 1e-9 under float16 autocast: the product's gradient, 1e-9 per element,
// is below float16's smallest number.
Tensor tiny_loss(const Tensor& x, const Tensor& w) {
  gw::AutocastGuard amp(gw::DeviceType::CPU, gw::kFloat16);
  return gw::matmul(x, w).sum() * 1e-9;
}

}  // namespace

TEST_CASE("GradScaler brings float16 gradients through that would flush to zero", "[optim][amp]") {
  gw::Generator gen(4);
  const Tensor x = gw::randn({5, 4}, gen);
  Tensor w = gw::randn({4, 3}, gen).requires_grad_();
  const Tensor w0 = w.detach().clone();
  gw::optim::SGD opt({w}, gw::optim::SGDOptions{.lr = 1e6});

  tiny_loss(x, w).backward();
  CHECK(w.grad().dtype() == gw::kFloat32);
  CHECK(gw::equal(w.grad(), gw::zeros({4, 3})));  // flushed: no scaler

  opt.zero_grad();
  gw::optim::GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  scaler.scale(tiny_loss(x, w)).backward();
  scaler.unscale_(opt);
  // d/dw sum(x w) * 1e-9 = 1e-9 * x^T 1, to float16's rounding of the scaled values.
  const Tensor want = gw::matmul(x.t(), gw::ones({5, 3})) * 1e-9;
  CHECK(gw::allclose(w.grad(), want, 1e-2, 1e-12));
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(gw::allclose(w0 - w.detach(), want * 1e6, 1e-2, 1e-7));  // stepped by lr * gradient
  CHECK(scaler.get_scale() == 65536.0);                          // 1 good step of 2000
  // A float16 loss is scaled in float32 (65536 is float16's infinity).
  const Tensor scaled = scaler.scale(gw::full({}, 0.5, gw::kFloat16));
  CHECK(scaled.dtype() == gw::kFloat32);
  CHECK(scaled.item<double>() == 32768.0);
}

TEST_CASE("GradScaler skips a step with inf or NaN gradients and backs off, grows after good ones",
          "[optim][amp]") {
  Tensor w = gw::ones({3}).requires_grad_();
  gw::optim::SGD opt({w}, gw::optim::SGDOptions{.lr = 0.5});
  gw::optim::GradScaler scaler({.init_scale = 8, .growth_interval = 2});
  for (const float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    INFO("a gradient of " << bad);
    const double before = scaler.get_scale();
    w.set_grad(gw::from_vector(std::vector<float>{8, bad, 8}, {3}));
    CHECK_FALSE(scaler.step(opt));
    scaler.update();
    CHECK(w.detach().to_vector<float>() == std::vector<float>{1, 1, 1});  // unchanged
    CHECK(scaler.get_scale() == before / 2);
  }
  const double low = scaler.get_scale();  // 2
  for (int i = 0; i < 2; ++i) {
    w.set_grad(gw::full({3}, low));  // unscaled: 1
    CHECK(scaler.step(opt));
    scaler.update();
  }
  CHECK(w.detach().to_vector<float>() == std::vector<float>{0, 0, 0});  // two steps of -0.5 * 1
  CHECK(scaler.get_scale() == low * 2);
}

TEST_CASE("GradScaler over two optimizers, bfloat16 gradients, and a failed unscale",
          "[optim][amp]") {
  Tensor a = gw::ones({2}).requires_grad_(), b = gw::ones({2}).requires_grad_();
  Tensor unused = gw::ones({2}).requires_grad_();  // no gradient: skipped
  gw::optim::SGD opt_a({a, unused}, gw::optim::SGDOptions{.lr = 1});
  gw::optim::SGD opt_b({b}, gw::optim::SGDOptions{.lr = 1});
  gw::optim::GradScaler scaler({.init_scale = 4});
  // One optimizer's gradients overflow: it skips, the other steps, and the scale backs off.
  a.set_grad(gw::full({2}, 4.0));
  b.set_grad(gw::from_vector(std::vector<float>{4, std::numeric_limits<float>::infinity()}, {2}));
  CHECK(scaler.step(opt_a));
  CHECK_FALSE(scaler.step(opt_b));
  scaler.update();
  CHECK(a.detach().to_vector<float>() == std::vector<float>{0, 0});
  CHECK(b.detach().to_vector<float>() == std::vector<float>{1, 1});
  CHECK(scaler.get_scale() == 2);
  // bfloat16 gradients whose sum overflows but whose elements are finite: a good step.
  Tensor h = gw::zeros({3}, gw::kBFloat16).requires_grad_();
  gw::optim::SGD opt_h({h}, gw::optim::SGDOptions{.lr = 1e-38});
  h.set_grad(gw::full({3}, 3e38, gw::kBFloat16));  // unscaled: 1.5e38 each, 4.5e38 in all
  CHECK(scaler.step(opt_h));
  scaler.update();
  CHECK(std::isfinite(h.detach().to(gw::kFloat32).to_vector<float>()[0]));
  // An unscale that fails partway (an expanded gradient cannot be written in place) skips the
  // step rather than take it on half-divided gradients.
  a.set_grad(gw::full({1}, 2.0).expand({2}));
  CHECK_THROWS(scaler.unscale_(opt_a));
  CHECK_FALSE(scaler.step(opt_a));
  scaler.update();
  CHECK(scaler.get_scale() == 1);
  // float16 gradients are refused; so is an optimizer with nothing to check.
  Tensor f = gw::zeros({2}, gw::kFloat16).requires_grad_();
  gw::optim::SGD opt_f({f}, gw::optim::SGDOptions{.lr = 1});
  f.set_grad(gw::ones({2}, gw::kFloat16));
  CHECK_THROWS_WITH(scaler.unscale_(opt_f), Catch::Contains("float16"));
  gw::optim::SGD opt_none({unused}, gw::optim::SGDOptions{.lr = 1});
  CHECK_THROWS_WITH(scaler.step(opt_none),
                    Catch::Contains("none of") && Catch::Contains("gradient"));
}

TEST_CASE("GradScaler's state round-trips, and bad state is refused", "[optim][amp]") {
  gw::optim::GradScaler a({.init_scale = 8, .growth_interval = 3});
  Tensor w = gw::ones({1}).requires_grad_();
  gw::optim::SGD opt({w}, gw::optim::SGDOptions{.lr = 1});
  for (int i = 0; i < 4; ++i) {  // 3 good iterations: 16; then one more
    w.set_grad(gw::ones({1}));
    a.step(opt);
    a.update();
  }
  gw::optim::GradScaler b({.growth_interval = 3});
  b.load_state_dict(a.state_dict());
  CHECK(b.get_scale() == 16);
  for (int i = 0; i < 2; ++i) {  // 2 more good iterations complete the interval
    w.set_grad(gw::ones({1}));
    b.step(opt);
    b.update();
  }
  CHECK(b.get_scale() == 32);
  gw::NamedTensors bad = a.state_dict();
  bad["growth_tracker"] = gw::scalar_tensor(7.0, gw::kFloat64);
  CHECK_THROWS_WITH(b.load_state_dict(bad), Catch::Contains("growth_tracker"));
  bad["growth_tracker"] = gw::scalar_tensor(1.5, gw::kFloat64);  // a count of good steps
  CHECK_THROWS_WITH(b.load_state_dict(bad), Catch::Contains("growth_tracker 1.5"));
  CHECK(b.get_scale() == 32);
}

TEST_CASE("GradScaler refuses misuse and bad options; disabled, it passes through",
          "[optim][amp]") {
  Tensor w = gw::ones({2}).requires_grad_();
  gw::optim::SGD opt({w}, gw::optim::SGDOptions{.lr = 1});
  gw::optim::GradScaler scaler;
  CHECK_THROWS_AS(scaler.update(), gw::StateError);  // nothing to update from
  w.set_grad(gw::ones({2}));
  scaler.unscale_(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt), Catch::Contains("already"));
  CHECK(scaler.step(opt));
  CHECK_THROWS_WITH(scaler.step(opt), Catch::Contains("already"));
  CHECK_THROWS_WITH(scaler.unscale_(opt), Catch::Contains("after step"));
  scaler.update();
  const float stepped = 1.f - 1.f / 65536;  // the gradient unscaled once
  CHECK(w.detach().to_vector<float>() == std::vector<float>{stepped, stepped});
  CHECK_THROWS_AS(gw::optim::GradScaler({.init_scale = 0}), gw::InvalidArgumentError);
  CHECK_THROWS_AS(gw::optim::GradScaler({.backoff_factor = 1}), gw::InvalidArgumentError);

  gw::optim::GradScaler off({.enabled = false});
  const Tensor loss = gw::full({}, 3.0);
  CHECK(off.scale(loss).item<double>() == 3.0);
  CHECK(off.get_scale() == 1.0);
  w.set_grad(gw::ones({2}));
  CHECK(off.step(opt));
  off.update();
  CHECK(w.detach().to_vector<float>() == std::vector<float>{stepped - 1, stepped - 1});
}
