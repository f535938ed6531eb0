// nn::functional: the losses against their formulas computed in double, and the checks on
// what each function accepts.
#include <catch2/catch.hpp>

#include <cmath>

#include "nn_test_util.h"

using gw::Tensor;
namespace F = gw::nn::functional;
using F::Reduction;
using nn_test::check_values;
using nn_test::values;

namespace {

// -log softmax(x[n])[y[n]] for (N,C) scores, in double.
std::vector<double> manual_cross_entropy(const Tensor& x, const std::vector<int64_t>& y) {
  const int64_t n = x.size(0), c = x.size(1);
  std::vector<double> xv = values(x), out;
  for (int64_t i = 0; i < n; ++i) {
    double m = xv[i * c];
    for (int64_t j = 1; j < c; ++j) m = std::max(m, xv[i * c + j]);
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(xv[i * c + j] - m);
    out.push_back(m + std::log(s) - xv[i * c + y[i]]);
  }
  return out;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

}  // namespace

TEST_CASE("cross_entropy with class indices, mean, sum and none", "[nn][functional][loss]") {
  gw::Generator gen(30);
  Tensor x = gw::randn({6, 4}, gen) * 2.0;
  std::vector<int64_t> labels = {0, 3, 1, 1, 2, 3};
  Tensor y = gw::from_vector(labels);
  std::vector<double> expected = manual_cross_entropy(x, labels);

  check_values(F::cross_entropy(x, y, Reduction::kNone), expected);
  Tensor mean = F::cross_entropy(x, y);
  CHECK(mean.dim() == 0);
  check_values(mean, {sum(expected) / 6});
  check_values(F::cross_entropy(x, y, Reduction::kSum), {sum(expected)});

  // An unbatched (C) input with a 0-dim target.
  check_values(F::cross_entropy(x[2], gw::scalar_tensor(int64_t{1})), {expected[2]});

  // (N,C,d) scores with (N,d) targets: the class dim is 1.
  Tensor x3 = gw::randn({2, 3, 4}, gen);
  Tensor y3 = gw::from_vector<int64_t>({0, 1, 2, 2, 1, 1, 0, 2}, {2, 4});
  Tensor flat = x3.permute({0, 2, 1}).reshape({8, 3});
  std::vector<double> per = manual_cross_entropy(flat, y3.to_vector<int64_t>());
  Tensor none3 = F::cross_entropy(x3, y3, Reduction::kNone);
  CHECK(none3.sizes() == gw::Shape{2, 4});
  check_values(none3, per);
  check_values(F::cross_entropy(x3, y3), {sum(per) / 8});
}

TEST_CASE("cross_entropy rejects bad targets", "[nn][functional][loss]") {
  gw::Generator gen(31);
  Tensor x = gw::randn({3, 4}, gen);
  CHECK_THROWS_AS(F::cross_entropy(x, gw::zeros({3})), gw::DTypeError);
  CHECK_THROWS_WITH(F::cross_entropy(x, gw::zeros({3})),
                    Catch::Contains("[cross_entropy]") && Catch::Contains("float32"));
  CHECK_THROWS_AS(F::cross_entropy(x, gw::from_vector<int32_t>({0, 1, 2})), gw::DTypeError);
  CHECK_THROWS_AS(F::cross_entropy(x, gw::from_vector<int64_t>({0, 4, 1})), gw::IndexError);
  CHECK_THROWS_WITH(F::cross_entropy(x, gw::from_vector<int64_t>({0, 4, 1})),
                    Catch::Contains("[cross_entropy]") && Catch::Contains("target 4") &&
                        Catch::Contains("4 classes"));
  CHECK_THROWS_AS(F::cross_entropy(x, gw::from_vector<int64_t>({-1, 0, 1})), gw::IndexError);
  CHECK_THROWS_AS(F::cross_entropy(x, gw::from_vector<int64_t>({0, 1})), gw::ShapeError);
  CHECK_THROWS_WITH(F::cross_entropy(x, gw::from_vector<int64_t>({0, 1})),
                    Catch::Contains("(2)") && Catch::Contains("(3,4)"));
  CHECK_THROWS_AS(F::cross_entropy(gw::scalar_tensor(1.0f), gw::scalar_tensor(int64_t{0})),
                  gw::ShapeError);
}

TEST_CASE("nll_loss picks -input[target]", "[nn][functional][loss]") {
  gw::Generator gen(32);
  Tensor x = gw::randn({4, 5}, gen);
  std::vector<int64_t> labels = {4, 0, 2, 2};
  std::vector<double> xv = values(x), expected;
  for (int i = 0; i < 4; ++i) expected.push_back(-xv[i * 5 + labels[i]]);
  Tensor y = gw::from_vector(labels);
  check_values(F::nll_loss(x, y, Reduction::kNone), expected);
  check_values(F::nll_loss(x, y), {sum(expected) / 4});
  check_values(F::nll_loss(x, y, Reduction::kSum), {sum(expected)});
  // With log_softmax first it is cross_entropy.
  CHECK(gw::allclose(F::nll_loss(F::log_softmax(x, 1), y), F::cross_entropy(x, y)));

  CHECK_THROWS_WITH(F::nll_loss(x, gw::from_vector<int64_t>({0, 1, 5, 0})),
                    Catch::Contains("[nll_loss]") && Catch::Contains("target 5"));
  CHECK_THROWS_AS(F::nll_loss(x, gw::ones({4})), gw::DTypeError);
  CHECK_THROWS_AS(F::nll_loss(gw::from_vector<int64_t>({1, 2}), gw::scalar_tensor(int64_t{0})),
                  gw::DTypeError);
}

TEST_CASE("mse_loss is the mean or sum of squared differences", "[nn][functional][loss]") {
  gw::Generator gen(33);
  Tensor a = gw::randn({3, 4}, gen), b = gw::randn({3, 4}, gen);
  std::vector<double> av = values(a), bv = values(b), sq;
  for (size_t i = 0; i < av.size(); ++i) sq.push_back((av[i] - bv[i]) * (av[i] - bv[i]));
  check_values(F::mse_loss(a, b), {sum(sq) / 12});
  check_values(F::mse_loss(a, b, Reduction::kSum), {sum(sq)});
  check_values(F::mse_loss(a, b, Reduction::kNone), sq);
  CHECK_THROWS_AS(F::mse_loss(a, gw::randn({4, 3}, gen)), gw::ShapeError);
  CHECK_THROWS_WITH(F::mse_loss(a, gw::randn({4}, gen)),
                    Catch::Contains("[mse_loss]") && Catch::Contains("(3,4)"));
  CHECK_THROWS_AS(F::mse_loss(a, gw::zeros({3, 4}, gw::kInt64)), gw::DTypeError);
}

TEST_CASE("functional layers check their arguments", "[nn][functional]") {
  gw::Generator gen(34);
  Tensor w = gw::randn({3, 4}, gen);
  CHECK_THROWS_WITH(F::linear(gw::randn({2, 5}, gen), w),
                    Catch::Contains("[linear]") && Catch::Contains("(2,5)"));
  CHECK_THROWS_AS(F::linear(gw::randn({2, 4}, gen), w, gw::randn({4}, gen)), gw::ShapeError);
  CHECK_THROWS_WITH(F::conv2d(gw::randn({1, 2, 5, 5}, gen), gw::randn({4, 3, 3, 3}, gen)),
                    Catch::Contains("[conv2d]") && Catch::Contains("2 channels"));
  CHECK_THROWS_AS(F::conv2d(gw::randn({5, 5}, gen), gw::randn({4, 3, 3, 3}, gen)), gw::ShapeError);
  CHECK_THROWS_AS(F::max_pool2d(gw::randn({1, 1, 6, 6}, gen), {2, 2}, {1, 1}, {2, 0}),
                  gw::InvalidArgumentError);
  CHECK_THROWS_AS(F::layer_norm(gw::randn({2, 3}, gen), {2}), gw::ShapeError);
  CHECK_THROWS_AS(F::layer_norm(gw::randn({2, 3}, gen), {3}, gw::ones({2})), gw::ShapeError);
  CHECK_THROWS_AS(F::embedding(gw::from_vector<int64_t>({3}), gw::randn({3, 2}, gen)),
                  gw::IndexError);
  CHECK_THROWS_AS(F::dropout(gw::ones({3}), 2.0, true, gen), gw::InvalidArgumentError);
  CHECK_THROWS_AS(F::dropout(gw::ones({3}, gw::kInt64), 0.5, true, gen), gw::DTypeError);

  // Functional forms agree with the direct core ops where they overlap.
  Tensor x = gw::randn({2, 3, 6, 6}, gen);
  Tensor k = gw::randn({4, 3, 3, 3}, gen);
  CHECK(gw::equal(F::conv2d(x, k), gw::conv2d(x, k)));
  CHECK(gw::equal(F::max_pool2d(x, {2, 2}), gw::max_pool2d(x, {2, 2})));
  CHECK(gw::equal(F::flatten(x, 1), x.reshape({2, 108})));
  CHECK(gw::equal(F::dropout(x, 0.5, false, gen), x));
}

TEST_CASE("functional dropout with the same seed gives the same mask", "[nn][functional]") {
  Tensor x = gw::ones({1000});
  gw::Generator g1(5), g2(5);
  Tensor a = F::dropout(x, 0.4, true, g1), b = F::dropout(x, 0.4, true, g2);
  CHECK(gw::equal(a, b));
  gw::manual_seed(17);
  Tensor c = F::dropout(x, 0.4);
  gw::manual_seed(17);
  Tensor d = F::dropout(x, 0.4);
  CHECK(gw::equal(c, d));
  int zeros = 0;
  for (double v : values(a)) zeros += v == 0;
  CHECK(zeros > 300);  // p = 0.4 of 1000: mean 400, sd 15.5
  CHECK(zeros < 500);
}
