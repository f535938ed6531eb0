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
  CHECK(gw::allclose(w.detach(), w0 - want * 1e6, 1e-2, 1e-5));  // stepped
  CHECK(scaler.get_scale() == 65536.0);                          // 1 good step of 2000
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
