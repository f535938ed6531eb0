// nn::init: fans and gains against PyTorch's formulas, and the distributions the initializers
// draw (range, mean and standard deviation within bounds of many standard errors).
#include <catch2/catch.hpp>

#include <cmath>

#include "nn_test_util.h"

using gw::Tensor;
using namespace gw::nn;
namespace init = gw::nn::init;

namespace {

struct Stats {
  double mean = 0, std = 0, min = 0, max = 0;
  int64_t n = 0;
};

Stats stats(const Tensor& t) {
  std::vector<double> v = nn_test::values(t);
  Stats s;
  s.n = static_cast<int64_t>(v.size());
  s.min = s.max = v[0];
  for (double x : v) {
    s.mean += x / s.n;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  for (double x : v) s.std += (x - s.mean) * (x - s.mean) / s.n;
  s.std = std::sqrt(s.std);
  return s;
}

// U(-bound, bound): inside the range, reaching near both ends, mean ~ 0, std ~ bound/sqrt(3).
void check_symmetric_uniform(const Tensor& t, double bound) {
  Stats s = stats(t);
  INFO("bound " << bound << ": min " << s.min << " max " << s.max << " mean " << s.mean << " std "
                << s.std << " n " << s.n);
  CHECK(s.min >= -bound);
  CHECK(s.max <= bound);
  CHECK(s.max > bound * (1 - 20.0 / s.n));  // the largest of n draws is this close to the end
  CHECK(s.min < -bound * (1 - 20.0 / s.n));
  double sd = bound / std::sqrt(3.0);
  CHECK(std::abs(s.mean) < 6 * sd / std::sqrt(static_cast<double>(s.n)));
  CHECK(std::abs(s.std / sd - 1) < 3 / std::sqrt(static_cast<double>(s.n)));  // ~6.7 SE
}

// N(0, std^2): mean and standard deviation within six standard errors.
void check_normal(const Tensor& t, double mean, double sd) {
  Stats s = stats(t);
  INFO("expected N(" << mean << ", " << sd << "^2): mean " << s.mean << " std " << s.std << " n "
                     << s.n);
  CHECK(std::abs(s.mean - mean) < 6 * sd / std::sqrt(static_cast<double>(s.n)));
  CHECK(std::abs(s.std / sd - 1) < 6 / std::sqrt(2.0 * s.n));
}

}  // namespace

TEST_CASE("calculate_fan_in_and_fan_out follows PyTorch", "[nn][init]") {
  auto fans = init::calculate_fan_in_and_fan_out(gw::empty({5, 3}));  // Linear(3, 5)
  CHECK(fans.fan_in == 3);
  CHECK(fans.fan_out == 5);
  fans = init::calculate_fan_in_and_fan_out(gw::empty({8, 4, 3, 5}));  // Conv2d(4, 8, (3, 5))
  CHECK(fans.fan_in == 4 * 3 * 5);
  CHECK(fans.fan_out == 8 * 3 * 5);
  fans = init::calculate_fan_in_and_fan_out(gw::empty({2, 3, 4}));
  CHECK(fans.fan_in == 12);
  CHECK(fans.fan_out == 8);
  CHECK_THROWS_AS(init::calculate_fan_in_and_fan_out(gw::empty({7})), gw::InvalidArgumentError);
  CHECK_THROWS_WITH(init::calculate_fan_in_and_fan_out(gw::empty({7})), Catch::Contains("(7)"));
}

TEST_CASE("calculate_gain follows PyTorch", "[nn][init]") {
  using init::Nonlinearity;
  CHECK(init::calculate_gain(Nonlinearity::kLinear) == 1);
  CHECK(init::calculate_gain(Nonlinearity::kConv2d) == 1);
  CHECK(init::calculate_gain(Nonlinearity::kSigmoid) == 1);
  CHECK(init::calculate_gain(Nonlinearity::kTanh) == Approx(5.0 / 3));
  CHECK(init::calculate_gain(Nonlinearity::kReLU) == Approx(std::sqrt(2.0)));
  CHECK(init::calculate_gain(Nonlinearity::kLeakyReLU) == Approx(std::sqrt(2 / (1 + 0.01 * 0.01))));
  CHECK(init::calculate_gain(Nonlinearity::kLeakyReLU, 0.2) == Approx(std::sqrt(2 / 1.04)));
  CHECK(init::calculate_gain(Nonlinearity::kLeakyReLU, std::sqrt(5.0)) ==
        Approx(std::sqrt(1.0 / 3)));
  CHECK(init::calculate_gain(Nonlinearity::kSELU) == 0.75);
}

TEST_CASE("uniform_, normal_ and the constant fills", "[nn][init]") {
  gw::Generator gen(50);
  Tensor t = gw::empty({200, 300});
  Tensor same = init::uniform_(t, gen, -2, 3);
  CHECK(same.same(t));
  Stats s = stats(t);
  CHECK(s.min >= -2);
  CHECK(s.max < 3);
  double sd = 5 / std::sqrt(12.0);
  CHECK(std::abs(s.mean - 0.5) < 6 * sd / std::sqrt(60000.0));
  CHECK(std::abs(s.std / sd - 1) < 0.01);

  init::normal_(t, gen, 1.5, 0.5);
  check_normal(t, 1.5, 0.5);

  // On a parameter that requires grad, with grad mode on: the fills run without recording.
  Linear fc(3, 2, gen);
  init::constant_(fc.weight, 0.75);
  CHECK(nn_test::values(fc.weight) == std::vector<double>(6, 0.75));
  init::ones_(fc.bias);
  CHECK(nn_test::values(fc.bias) == std::vector<double>(2, 1.0));
  init::zeros_(fc.bias);
  CHECK(nn_test::values(fc.bias) == std::vector<double>(2, 0.0));
  CHECK(fc.weight.is_leaf());
  CHECK(fc.weight.requires_grad());

  CHECK_THROWS_AS(init::uniform_(gw::zeros({3}, gw::kInt64), gen), gw::DTypeError);
  CHECK_THROWS_AS(init::uniform_(gw::zeros({3}), gen, 1, 0), gw::InvalidArgumentError);
}

TEST_CASE("xavier initializers use gain * sqrt(2 / (fan_in + fan_out))", "[nn][init]") {
  gw::Generator gen(51);
  Tensor w = gw::empty({300, 200});
  init::xavier_uniform_(w, gen, 2.0);
  check_symmetric_uniform(w, 2.0 * std::sqrt(6.0 / 500));
  init::xavier_normal_(w, gen);
  check_normal(w, 0, std::sqrt(2.0 / 500));
  Tensor conv = gw::empty({16, 8, 3, 3});  // fans 72 and 144
  init::xavier_uniform_(conv, gen);
  check_symmetric_uniform(conv, std::sqrt(6.0 / (72 + 144)));
}

TEST_CASE("kaiming initializers use gain / sqrt(fan)", "[nn][init]") {
  gw::Generator gen(52);
  Tensor w = gw::empty({256, 128});
  init::kaiming_uniform_(w, gen);  // leaky_relu with a = 0: gain sqrt(2), fan_in 128
  check_symmetric_uniform(w, std::sqrt(2.0) * std::sqrt(3.0 / 128));

  Tensor conv = gw::empty({16, 8, 3, 3});  // fan_out 144
  init::kaiming_uniform_(
      conv, gen, {.mode = init::FanMode::kFanOut, .nonlinearity = init::Nonlinearity::kReLU});
  check_symmetric_uniform(conv, std::sqrt(6.0 / 144));

  init::kaiming_normal_(
      w, gen, {.mode = init::FanMode::kFanOut, .nonlinearity = init::Nonlinearity::kReLU});
  check_normal(w, 0, std::sqrt(2.0 / 256));
  init::kaiming_normal_(w, gen, {.a = 0.2});  // leaky_relu(0.2), fan_in
  check_normal(w, 0, std::sqrt(2 / 1.04) / std::sqrt(128.0));

  CHECK_THROWS_AS(init::kaiming_uniform_(gw::empty({5}), gen), gw::InvalidArgumentError);
  CHECK_THROWS_AS(init::xavier_normal_(gw::empty({5}), gen), gw::InvalidArgumentError);
}

TEST_CASE("layers start from PyTorch's default initialization", "[nn][init]") {
  gw::Generator gen(53);
  // Linear and Conv2d: kaiming_uniform_(a = sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and
  // the bias has the same bound.
  Linear fc(400, 300, gen);
  check_symmetric_uniform(fc.weight, 1 / std::sqrt(400.0));
  Stats b = stats(fc.bias);
  CHECK(b.min >= -0.05);
  CHECK(b.max <= 0.05);
  CHECK(b.max - b.min > 0.09);  // 300 draws span nearly all of [-0.05, 0.05]

  Conv2d conv(6, 16, 5, gen);  // fan_in 150
  check_symmetric_uniform(conv.weight, 1 / std::sqrt(150.0));
  Stats cb = stats(conv.bias);
  CHECK(cb.min >= -1 / std::sqrt(150.0));
  CHECK(cb.max <= 1 / std::sqrt(150.0));

  Embedding emb(1000, 50, gen);
  check_normal(emb.weight, 0, 1);

  LayerNorm norm({4, 5});
  CHECK(nn_test::values(norm.weight) == std::vector<double>(20, 1.0));
  CHECK(nn_test::values(norm.bias) == std::vector<double>(20, 0.0));
}

TEST_CASE("a seed fixes the initial weights", "[nn][init]") {
  gw::Generator g1(7), g2(7), g3(8);
  Linear a(5, 4, g1), b(5, 4, g2), c(5, 4, g3);
  CHECK(gw::equal(a.weight.detach(), b.weight.detach()));
  CHECK(gw::equal(a.bias.detach(), b.bias.detach()));
  CHECK_FALSE(gw::equal(a.weight.detach(), c.weight.detach()));

  // The constructors without a generator draw from the default one.
  gw::manual_seed(11);
  Conv2d d(2, 3, 3);
  Embedding e(4, 2);
  gw::manual_seed(11);
  Conv2d f(2, 3, 3);
  Embedding g(4, 2);
  CHECK(gw::equal(d.weight.detach(), f.weight.detach()));
  CHECK(gw::equal(e.weight.detach(), g.weight.detach()));
  gw::Generator explicit_gen(11);
  Conv2d h(2, 3, 3, explicit_gen);
  CHECK(gw::equal(d.weight.detach(), h.weight.detach()));
}
