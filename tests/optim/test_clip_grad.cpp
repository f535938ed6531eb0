// clip_grad_norm_ against hand-computed norms: p-norms, infinity, float16, NaN and infinite
// gradients, bad norm types.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/clip_grad.h"
#include "optim_test_util.h"

using gw::Tensor;

namespace {

// Elementwise |got - expected| <= rtol * |expected| + 1e-6.
void clip_check_values(const Tensor& got, const std::vector<double>& expected, double rtol = 1e-5) {
  std::vector<double> a = got.to(gw::kFloat64).to_vector<double>();
  REQUIRE(a.size() == expected.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": got " << a[i] << ", expected " << expected[i]);
    CHECK(std::abs(a[i] - expected[i]) <= 1e-6 + rtol * std::abs(expected[i]));
  }
}

}  // namespace

TEST_CASE("clip_grad_norm_ scales gradients to a total norm, as PyTorch", "[optim][clip]") {
  Tensor a = gw::zeros({2}).requires_grad_(), b = gw::zeros({1}).requires_grad_();
  Tensor c = gw::zeros({3}).requires_grad_();  // no gradient: skipped
  auto set = [&] {
    a.set_grad(gw::from_vector(std::vector<float>{3, -4}, {2}));
    b.set_grad(gw::from_vector(std::vector<float>{12}, {1}));
  };
  set();
  // 2-norm: sqrt(9 + 16 + 144) = 13; scale 6.5 / (13 + 1e-6).
  Tensor norm = gw::optim::clip_grad_norm_({a, b, c}, 6.5);
  CHECK(norm.item<double>() == Approx(13.0));
  const double k = 6.5 / (13 + 1e-6);
  clip_check_values(a.grad(), {3 * k, -4 * k});
  clip_check_values(b.grad(), {12 * k});
  CHECK_FALSE(c.grad().defined());
  // Under max_norm: unchanged. The infinity norm is the largest |g|; p = 1 the sum.
  set();
  CHECK(gw::optim::clip_grad_norm_({a, b}, 100.0).item<double>() == Approx(13.0));
  clip_check_values(a.grad(), {3, -4});
  CHECK(gw::optim::clip_grad_norm_({a, b}, 100.0, std::numeric_limits<double>::infinity())
            .item<double>() == Approx(12.0));
  CHECK(gw::optim::clip_grad_norm_({a, b}, 100.0, 1.0).item<double>() == Approx(19.0));
  CHECK(gw::optim::clip_grad_norm_({c}, 1.0).item<double>() == 0.0);  // no gradient at all
  // A non-finite norm: an error with error_if_nonfinite, and nothing changed.
  b.set_grad(gw::from_vector(std::vector<float>{std::numeric_limits<float>::infinity()}, {1}));
  CHECK_THROWS_WITH(gw::optim::clip_grad_norm_({a, b}, 1.0, 2.0, true),
                    Catch::Contains("[clip_grad_norm_]") && Catch::Contains("inf"));
  clip_check_values(a.grad(), {3, -4});
  CHECK_THROWS_WITH(gw::optim::clip_grad_norm_({a}, 1.0, -1.0), Catch::Contains("norm_type"));
  CHECK_THROWS_WITH(gw::optim::clip_grad_norm_({a}, 1.0, 0.0), Catch::Contains("norm_type"));
  const std::vector<float> before = a.grad().to_vector<float>();
  CHECK_THROWS_WITH(gw::optim::clip_grad_norm_({a}, -1.0),
                    Catch::Contains("[clip_grad_norm_] max_norm") && Catch::Contains("-1"));
  CHECK_THROWS_WITH(gw::optim::clip_grad_norm_({a}, std::nan("")), Catch::Contains("max_norm"));
  CHECK(a.grad().to_vector<float>() == before);  // untouched
  // float16 gradients whose squares overflow float16 (300^2 > 65504): the norm is still exact.
  Tensor h = gw::zeros({2}, gw::kFloat16).requires_grad_();
  h.set_grad(gw::from_vector(std::vector<float>{300, 400}, {2}).to(gw::kFloat16));
  CHECK(gw::optim::clip_grad_norm_({h}, 1000.0).item<double>() == Approx(500.0));
  CHECK(gw::optim::clip_grad_norm_({h}, 50.0).item<double>() == Approx(500.0));
  clip_check_values(h.grad(), {30, 40}, 1e-3);  // scaled by 50 / 500
  // A NaN gradient makes the norm NaN, and every gradient NaN, as in PyTorch.
  a.set_grad(gw::from_vector(std::vector<float>{std::nanf(""), 1}, {2}));
  b.set_grad(gw::from_vector(std::vector<float>{2}, {1}));
  CHECK(std::isnan(gw::optim::clip_grad_norm_({a, b}, 1.0).item<double>()));
  CHECK(std::isnan(b.grad().item<double>()));
}
