// nn::functional: the losses against their formulas computed in double, and the checks on
// what each function accepts.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

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

namespace {
// Gradients of sum(f(inputs) * weights) with respect to every input, through autograd.
std::vector<Tensor> grads_of(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, const Tensor& weights) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.detach().requires_grad_(true));
  gw::sum(f(leaves) * weights).backward();
  std::vector<Tensor> grads;
  for (const Tensor& t : leaves) grads.push_back(t.grad());
  return grads;
}
}  // namespace

TEST_CASE("fused layer_norm and cross_entropy equal their composite definitions",
          "[nn][functional]") {
  gw::Generator gen(31);
  Tensor x = gw::randn({4, 3, 6}, gen) * 3.0 + 1.0, w = gw::randn({3, 6}, gen),
         b = gw::randn({3, 6}, gen), weights = gw::randn({4, 3, 6}, gen);
  // layer_norm over the last two dims, against mean/var/rsqrt composed by hand.
  auto composite = [](const std::vector<Tensor>& in) {
    Tensor centered = in[0] - in[0].mean({1, 2}, true);
    Tensor var = gw::square(centered).mean({1, 2}, true);
    return centered * gw::rsqrt(var + 1e-5) * in[1] + in[2];
  };
  auto fused = [](const std::vector<Tensor>& in) {
    return F::layer_norm(in[0], {3, 6}, in[1], in[2], 1e-5);
  };
  CHECK(gw::allclose(fused({x, w, b}), composite({x, w, b}), 1e-5, 1e-6));
  auto expected = grads_of(composite, {x, w, b}, weights);
  auto actual = grads_of(fused, {x, w, b}, weights);
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient " << i);
    CHECK(gw::allclose(actual[i], expected[i], 1e-4, 1e-5));
  }
  // A weight of another dtype is converted for the kernel; its gradient comes back in its own.
  Tensor w64 = w.to(gw::kFloat64).detach().requires_grad_(true);
  Tensor y64 = F::layer_norm(x, {3, 6}, w64, b, 1e-5);
  CHECK(y64.dtype() == gw::kFloat32);
  (y64 * weights).sum().backward();
  CHECK(w64.grad().dtype() == gw::kFloat64);
  CHECK(gw::allclose(w64.grad().to(gw::kFloat32), expected[1], 1e-4, 1e-5));
  // No rows: the parameters' gradients are sums of nothing.
  Tensor empty_rows = gw::zeros({0, 6}).requires_grad_(true);
  Tensor w6 = gw::ones({6}).requires_grad_(true), b6 = gw::zeros({6}).requires_grad_(true);
  F::layer_norm(empty_rows, {6}, w6, b6).sum().backward();
  CHECK(gw::equal(w6.grad(), gw::zeros({6})));
  CHECK(gw::equal(b6.grad(), gw::zeros({6})));

  // cross_entropy of (N, C) and of one (C) row, against log_softmax and a gather.
  Tensor logits = gw::randn({5, 7}, gen) * 2.0, row_weights = gw::randn({5}, gen);
  Tensor target = gw::randint(0, 7, {5}, gen);
  auto by_hand = [&target](const std::vector<Tensor>& in) {
    return -gw::gather(gw::log_softmax(in[0], 1), 1, target.unsqueeze(1)).squeeze(1);
  };
  auto loss = [&target](const std::vector<Tensor>& in) {
    return F::cross_entropy(in[0], target, Reduction::kNone);
  };
  CHECK(gw::allclose(loss({logits}), by_hand({logits}), 1e-6, 1e-7));
  CHECK(gw::allclose(grads_of(loss, {logits}, row_weights)[0],
                     grads_of(by_hand, {logits}, row_weights)[0], 1e-6, 1e-7));
  Tensor one = logits[0].detach().requires_grad_(true);
  F::cross_entropy(one, target[0]).backward();
  CHECK(one.grad().sizes() == gw::Shape{7});
  CHECK(gw::allclose(one.grad(), grads_of(loss, {logits}, gw::eye(5)[0])[0][0]));
}

TEST_CASE("float32 softmax, log_softmax and cross_entropy by vectors stay near float64",
          "[nn][functional]") {
  // Rows of every length about the kernels' vectors of 16 and blocks of 256, shifted by 30 (the
  // exp of x - max stays in range), with -inf entries, an all -inf row and a NaN row. The float32
  // kernels sum float lanes into double and take exp from a polynomial (relative error 2.5e-7).
  gw::Generator gen(9);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t n : {1, 7, 16, 17, 255, 256, 257, 1000}) {
    CAPTURE(n);
    Tensor x = gw::randn({5, n}, gen) * 4.0;
    x.select(0, 1).add_(30.0);
    if (n > 1) x.select(0, 2).slice(0, 0, n, 2).fill_(-inf);  // every other entry of row 2
    x.select(0, 3).fill_(-inf);
    x.select(0, 4).slice(0, n - 1, n).fill_(std::nan(""));
    const Tensor x64 = x.to(gw::kFloat64);
    auto close = [](const Tensor& single, const Tensor& reference, double tolerance) {
      const std::vector<double> a = values(single), b = values(reference);
      for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i, a[i], b[i]);
        if (std::isnan(b[i]) || std::isinf(b[i]))
          CHECK((a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))));
        else
          CHECK(std::abs(a[i] - b[i]) <= tolerance * (1 + std::abs(b[i])));
      }
    };
    close(gw::softmax(x, 1), gw::softmax(x64, 1), 1e-6);
    close(gw::log_softmax(x, 1), gw::log_softmax(x64, 1), 1e-6);
    // cross_entropy of the finite rows, per row and its gradient (of the sum).
    const Tensor target = gw::randint(0, n, {2}, gen);
    auto loss_and_grad = [&](gw::DType dtype) {
      Tensor logits = x.slice(0, 0, 2).to(dtype).detach().requires_grad_(true);
      Tensor loss = F::cross_entropy(logits, target, Reduction::kNone);
      loss.sum().backward();
      return std::pair{loss.detach(), logits.grad()};
    };
    const auto [loss, grad] = loss_and_grad(gw::kFloat32);
    const auto [loss64, grad64] = loss_and_grad(gw::kFloat64);
    close(loss, loss64, 1e-6);
    // The gradient's exp(x - lse) has lse rounded to float32: an error of its ulp (2e-6 at 30).
    close(grad, grad64, 5e-6);
  }
}

TEST_CASE("float32 layer_norm of rows whose mean dwarfs their spread, forward and backward",
          "[nn][functional]") {
  // Mean 100, spread 0.1: the float32 kernel centres each row on its mean to about double's
  // precision (the mean summed in double, and what rounding it to float32 lost taken off again,
  // forward and backward), so it stays within a few float32 roundings of float64. Centred on
  // the float32 mean alone, y was 8e-5 off and the gradients 2e-4 and 3e-4.
  gw::Generator gen(5);
  const Tensor x = gw::randn({16, 128}, gen) * 0.1 + 100.0, w = gw::randn({128}, gen),
               b = gw::randn({128}, gen), weights = gw::randn({16, 128}, gen);
  auto run = [&](gw::DType dtype) {
    std::vector<Tensor> in;
    for (const Tensor& t : {x, w, b}) in.push_back(t.to(dtype).detach().requires_grad_(true));
    const Tensor y = F::layer_norm(in[0], {128}, in[1], in[2]);
    (y * weights.to(dtype)).sum().backward();
    return std::vector<Tensor>{y.detach(), in[0].grad(), in[1].grad(), in[2].grad()};
  };
  const auto single = run(gw::kFloat32), reference = run(gw::kFloat64);
  // y is at most ~7, the gradients of x ~60 and of the weight ~13: a few float32 roundings each.
  const double bound[] = {2e-6, 3e-5, 5e-6, 5e-6};
  for (size_t i = 0; i < 4; ++i) {
    INFO("output " << i);
    const double err = gw::max(gw::abs(single[i].to(gw::kFloat64) - reference[i])).item<double>();
    CHECK(err < bound[i]);
  }
}
