// Each layer's forward pass against a direct computation in plain C++ loops, and the errors
// for inputs a layer cannot take.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "nn_test_util.h"

using gw::Tensor;
using namespace gw::nn;
using nn_test::check_values;
using nn_test::values;

namespace {

struct Geometry {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

// The textbook convolution: seven nested loops, zero padding.
std::vector<double> naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& b,
                                 const Geometry& g, int64_t& oh, int64_t& ow) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), o = w.size(0);
  oh = (h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  ow = (wd + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  std::vector<double> xv = values(x), wv = values(w),
                      bv = b.defined() ? values(b) : std::vector<double>(o, 0.0);
  std::vector<double> out;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t io = 0; io < o; ++io)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double acc = bv[io];
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                int64_t iy = y * g.sh - g.ph + ky * g.dh, ix = xx * g.sw - g.pw + kx * g.dw;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += xv[((in * c + ic) * h + iy) * wd + ix] *
                       wv[((io * c + ic) * g.kh + ky) * g.kw + kx];
              }
          out.push_back(acc);
        }
  return out;
}

// Max over each window, skipping positions in the padding.
std::vector<double> naive_max_pool2d(const Tensor& x, const Geometry& g, int64_t& oh, int64_t& ow) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  oh = (h + 2 * g.ph - (g.kh - 1) - 1) / g.sh + 1;
  ow = (wd + 2 * g.pw - (g.kw - 1) - 1) / g.sw + 1;
  std::vector<double> xv = values(x), out;
  for (int64_t plane = 0; plane < n * c; ++plane)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xx = 0; xx < ow; ++xx) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t ky = 0; ky < g.kh; ++ky)
          for (int64_t kx = 0; kx < g.kw; ++kx) {
            int64_t iy = y * g.sh - g.ph + ky, ix = xx * g.sw - g.pw + kx;
            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
            m = std::max(m, xv[(plane * h + iy) * wd + ix]);
          }
        out.push_back(m);
      }
  return out;
}

}  // namespace

TEST_CASE("Linear computes x W^T + b", "[nn][layers][linear]") {
  gw::Generator gen(20);
  Linear fc(4, 3, gen);
  Tensor x = gw::randn({5, 4}, gen);
  std::vector<double> xv = values(x), wv = values(fc.weight), bv = values(fc.bias), expected;
  for (int n = 0; n < 5; ++n)
    for (int o = 0; o < 3; ++o) {
      double acc = bv[o];
      for (int i = 0; i < 4; ++i) acc += xv[n * 4 + i] * wv[o * 4 + i];
      expected.push_back(acc);
    }
  Tensor y = fc.forward(x);
  CHECK(y.sizes() == gw::Shape{5, 3});
  check_values(y, expected);

  // Leading dims pass through; a 1-D input gives a 1-D output.
  CHECK(fc.forward(gw::randn({2, 7, 4}, gen)).sizes() == gw::Shape{2, 7, 3});
  Tensor row = fc.forward(x[1]);
  CHECK(row.sizes() == gw::Shape{3});
  check_values(row, {expected[3], expected[4], expected[5]});

  Linear no_bias(4, 3, false, gen);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.parameters().size() == 1);
  std::vector<double> nw = values(no_bias.weight), nb;
  for (int o = 0; o < 3; ++o) {
    double acc = 0;
    for (int i = 0; i < 4; ++i) acc += xv[i] * nw[o * 4 + i];
    nb.push_back(acc);
  }
  check_values(no_bias.forward(x[0]), nb);

  CHECK_THROWS_AS(fc.forward(gw::randn({5, 5}, gen)), gw::ShapeError);
  CHECK_THROWS_WITH(fc.forward(gw::randn({5, 5}, gen)), Catch::Contains("[Linear]") &&
                                                            Catch::Contains("(5,5)") &&
                                                            Catch::Contains("4"));
  CHECK_THROWS_AS(fc.forward(gw::scalar_tensor(1.0f)), gw::ShapeError);
  CHECK_THROWS_AS(Linear(-1, 3), gw::InvalidArgumentError);
}

TEST_CASE("Conv2d matches a naive convolution", "[nn][layers][conv]") {
  gw::Generator gen(21);
  struct Case {
    const char* name;
    Geometry g;
    bool bias;
  };
  const Case cases[] = {
      {"plain 3x3", {3, 3, 1, 1, 0, 0, 1, 1}, true},
      {"padding 1", {3, 3, 1, 1, 1, 1, 1, 1}, true},
      {"stride (2,1) padding (1,2)", {3, 2, 2, 1, 1, 2, 1, 1}, true},
      {"dilation (2,1), no bias", {2, 3, 1, 2, 0, 1, 2, 1}, false},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      gw::Conv2dOptions opts{{c.g.sh, c.g.sw}, {c.g.ph, c.g.pw}, {c.g.dh, c.g.dw}};
      Conv2d conv(3, 4, {c.g.kh, c.g.kw}, opts, c.bias, gen);
      Tensor x = gw::randn({2, 3, 7, 6}, gen);
      int64_t oh = 0, ow = 0;
      std::vector<double> expected = naive_conv2d(x, conv.weight, conv.bias, c.g, oh, ow);
      Tensor y = conv.forward(x);
      CHECK(y.sizes() == gw::Shape{2, 4, oh, ow});
      check_values(y, expected, 1e-5, 1e-5);
      // An unbatched (C,H,W) input is the same as a batch of one.
      Tensor single = conv.forward(x[1]);
      CHECK(single.sizes() == gw::Shape{4, oh, ow});
      CHECK(gw::allclose(single, y[1], 1e-5, 1e-6));
    }
  }

  Conv2d conv(3, 4, 3, gen);
  CHECK_THROWS_AS(conv.forward(gw::randn({2, 2, 7, 7}, gen)), gw::ShapeError);
  CHECK_THROWS_WITH(conv.forward(gw::randn({2, 2, 7, 7}, gen)),
                    Catch::Contains("[Conv2d]") && Catch::Contains("(2,2,7,7)") &&
                        Catch::Contains("in_channels=3"));
  CHECK_THROWS_AS(conv.forward(gw::randn({3, 7}, gen)), gw::ShapeError);
  CHECK_THROWS_AS(conv.forward(gw::randn({1, 3, 2, 2}, gen)), gw::ShapeError);  // too small
  CHECK_THROWS_AS(Conv2d(3, 4, 0), gw::InvalidArgumentError);
  CHECK_THROWS_AS(Conv2d(3, 4, 3, {.stride = {0, 1}}), gw::InvalidArgumentError);
}

TEST_CASE("MaxPool2d matches naive window maxima, padding included", "[nn][layers][pool]") {
  gw::Generator gen(22);
  struct Case {
    const char* name;
    Geometry g;
    MaxPool2dOptions opts;
  };
  const Case cases[] = {
      {"2x2", {2, 2, 2, 2, 0, 0, 1, 1}, {}},
      {"3x3 stride 1 padding 1", {3, 3, 1, 1, 1, 1, 1, 1}, {.stride = 1, .padding = 1}},
      {"(3,2) stride (2,1) padding (1,0)",
       {3, 2, 2, 1, 1, 0, 1, 1},
       {.stride = Size2(2, 1), .padding = Size2(1, 0)}},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      MaxPool2d pool({c.g.kh, c.g.kw}, c.opts);
      // Negative values make a -inf or zero padding leak visible.
      Tensor x = gw::randn({2, 3, 7, 6}, gen) - 3.0;
      int64_t oh = 0, ow = 0;
      std::vector<double> expected = naive_max_pool2d(x, c.g, oh, ow);
      Tensor y = pool.forward(x);
      CHECK(y.sizes() == gw::Shape{2, 3, oh, ow});
      check_values(y, expected, 0, 0);
      CHECK(gw::equal(pool.forward(x[0]), y[0]));
    }
  }
  MaxPool2d pool(2);
  CHECK_THROWS_WITH(pool.forward(gw::randn({4, 4}, gen)),
                    Catch::Contains("[MaxPool2d]") && Catch::Contains("(4,4)"));
  CHECK_THROWS_AS(MaxPool2d(2, {.padding = 2}), gw::InvalidArgumentError);
  CHECK_THROWS_AS(MaxPool2d(0), gw::InvalidArgumentError);
}

TEST_CASE("Flatten merges the requested dims", "[nn][layers][flatten]") {
  gw::Generator gen(23);
  Tensor x = gw::randn({2, 3, 4, 5}, gen);
  Tensor y = Flatten().forward(x);
  CHECK(y.sizes() == gw::Shape{2, 60});
  CHECK(values(y) == values(x));  // row-major order is kept
  CHECK(Flatten(0).forward(x).sizes() == gw::Shape{120});
  CHECK(Flatten(1, 2).forward(x).sizes() == gw::Shape{2, 12, 5});
  CHECK(Flatten(-3, -2).forward(x).sizes() == gw::Shape{2, 12, 5});
  CHECK_THROWS_AS(Flatten(4).forward(x), gw::IndexError);
  CHECK_THROWS_WITH(Flatten().forward(gw::randn({3}, gen)),
                    Catch::Contains("[Flatten]") && Catch::Contains("(3)"));
  CHECK_THROWS_AS(Flatten(2, 1).forward(x), gw::InvalidArgumentError);
}

TEST_CASE("activations compute their formulas", "[nn][layers][activation]") {
  gw::Generator gen(24);
  Tensor x = gw::randn({3, 7}, gen) * 3.0;
  std::vector<double> xv = values(x), relu, gelu, gelu_tanh, tanh, sigmoid;
  for (double v : xv) {
    relu.push_back(v > 0 ? v : 0);
    gelu.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    gelu_tanh.push_back(0.5 * v *
                        (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
    tanh.push_back(std::tanh(v));
    sigmoid.push_back(1 / (1 + std::exp(-v)));
  }
  check_values(ReLU().forward(x), relu);
  check_values(GELU().forward(x), gelu);
  check_values(GELU("tanh").forward(x), gelu_tanh);
  check_values(Tanh().forward(x), tanh);
  check_values(Sigmoid().forward(x), sigmoid);
  CHECK_THROWS_AS(GELU("fast"), gw::InvalidArgumentError);
}

TEST_CASE("Dropout keeps the expectation in training and is the identity in eval",
          "[nn][layers][dropout]") {
  const double p = 0.3;
  const int64_t n = 200000;
  gw::Generator gen(25);
  Dropout drop(p, gen);
  Tensor x = gw::ones({n});
  std::vector<double> y = values(drop.forward(x));
  int64_t zeros = 0;
  double sum = 0;
  for (double v : y) {
    if (v == 0) {
      ++zeros;
    } else {
      CHECK(std::abs(v - 1 / (1 - p)) < 1e-6);  // survivors are scaled by 1/(1-p)
    }
    sum += v;
  }
  // Binomial(n, p): standard deviation sqrt(p(1-p)/n) ~ 0.001; allow 6 of them.
  double frac = static_cast<double>(zeros) / n;
  CHECK(std::abs(frac - p) < 6 * std::sqrt(p * (1 - p) / n));
  CHECK(std::abs(sum / n - 1.0) < 6 * std::sqrt(p / (1 - p) / n));

  // The same seed gives the same mask; another seed a different one.
  gw::Generator g1(99), g2(99), g3(100);
  Tensor z = gw::randn({64}, gen);
  CHECK(gw::equal(Dropout(0.5, g1).forward(z), Dropout(0.5, g2).forward(z)));
  CHECK_FALSE(gw::equal(Dropout(0.5, g1).forward(z), Dropout(0.5, g3).forward(z)));

  drop.eval();
  CHECK(gw::equal(drop.forward(z), z));
  drop.train();
  CHECK(gw::equal(Dropout(0.0, gen).forward(z), z));
  CHECK(values(Dropout(1.0, gen).forward(z)) == std::vector<double>(64, 0.0));
  CHECK_THROWS_AS(Dropout(1.5, gen), gw::InvalidArgumentError);
  CHECK_THROWS_AS(Dropout(-0.1), gw::InvalidArgumentError);
}

TEST_CASE("Embedding picks rows of its weight", "[nn][layers][embedding]") {
  gw::Generator gen(26);
  Embedding emb(10, 3, gen);
  Tensor idx = gw::from_vector<int64_t>({7, 0, 7, 9, 2, 4}, {2, 3});
  Tensor y = emb.forward(idx);
  CHECK(y.sizes() == gw::Shape{2, 3, 3});
  std::vector<double> w = values(emb.weight), expected;
  for (int64_t i : idx.to_vector<int64_t>()) {
    for (int d = 0; d < 3; ++d) expected.push_back(w[i * 3 + d]);
  }
  check_values(y, expected, 0, 0);
  CHECK(emb.forward(gw::from_vector<int32_t>({9})).sizes() == gw::Shape{1, 3});

  CHECK_THROWS_AS(emb.forward(gw::from_vector<int64_t>({10})), gw::IndexError);
  CHECK_THROWS_WITH(emb.forward(gw::from_vector<int64_t>({3, -1})),
                    Catch::Contains("-1") && Catch::Contains("10"));
  CHECK_THROWS_AS(emb.forward(gw::ones({2})), gw::DTypeError);
  CHECK_THROWS_WITH(emb.forward(gw::ones({2})), Catch::Contains("[Embedding]"));
}

TEST_CASE("Embedding's padding_idx row starts at zero, is read as it is, and gets no gradient",
          "[nn][layers][embedding]") {
  // As torch.nn.Embedding(10, 3, padding_idx=-1): row 9.
  gw::Generator gen(27);
  Embedding emb(10, 3, {.padding_idx = -1}, gen);
  CHECK(emb.padding_idx == 9);
  CHECK(values(emb.weight.select(0, 9)) == std::vector<double>(3, 0.0));
  CHECK(emb.repr().find("Embedding(10, 3, padding_idx=9)") != std::string::npos);
  {
    gw::autograd::NoGradGuard no_grad;  // a padding vector the user set: read as it is
    emb.weight.select(0, 9).fill_(2.0);
  }
  const Tensor idx = gw::from_vector<int64_t>({9, 2, 9, 2}, {2, 2});
  const Tensor y = emb.forward(idx);
  CHECK(values(y.select(0, 0).select(0, 0)) == std::vector<double>(3, 2.0));
  (y * gw::arange(12).reshape({2, 2, 3}).to(gw::kFloat32)).sum().backward();
  const std::vector<double> g = values(emb.weight.grad());
  for (int64_t row = 0; row < 10; ++row) {
    INFO("row " << row);
    for (int d = 0; d < 3; ++d) {
      // Row 2 was read at places 1 and 3 of the batch: their upstream gradients, summed.
      const double want = row == 2 ? (3 + d) + (9 + d) : 0.0;
      CHECK(g[static_cast<size_t>(row * 3 + d)] == want);
    }
  }
  CHECK_THROWS_WITH(
      Embedding(10, 3, {.padding_idx = 10}, gen),
      Catch::Contains("[Embedding] padding_idx 10") && Catch::Contains("10 embeddings"));
  CHECK_THROWS_WITH(gw::nn::functional::embedding(idx, emb.weight, -11),
                    Catch::Contains("[embedding] padding_idx -11"));
  CHECK_THROWS_WITH(Embedding(-1, 3, {.padding_idx = 0}, gen), Catch::Contains("non-negative"));
  // int32 indices pad alike.
  const Tensor y32 = gw::nn::functional::embedding(idx.to(gw::kInt32), emb.weight, 9);
  CHECK(gw::equal(y32, y.detach()));
}

TEST_CASE("LayerNorm normalizes the trailing dims and applies its affine",
          "[nn][layers][layernorm]") {
  gw::Generator gen(27);
  LayerNorm norm({2, 3}, 1e-5);
  CHECK(values(norm.weight) == std::vector<double>(6, 1.0));
  CHECK(values(norm.bias) == std::vector<double>(6, 0.0));
  {
    gw::autograd::NoGradGuard no_grad;
    gw::normal_(norm.weight, 1, 0.5, gen);
    gw::normal_(norm.bias, 0, 0.5, gen);
  }
  Tensor x = gw::randn({4, 2, 3}, gen) * 2.0 + 1.0;
  std::vector<double> xv = values(x), wv = values(norm.weight), bv = values(norm.bias), expected;
  for (int s = 0; s < 4; ++s) {
    double mean = 0, var = 0;
    for (int i = 0; i < 6; ++i) mean += xv[s * 6 + i] / 6;
    for (int i = 0; i < 6; ++i) var += (xv[s * 6 + i] - mean) * (xv[s * 6 + i] - mean) / 6;
    for (int i = 0; i < 6; ++i) {
      expected.push_back((xv[s * 6 + i] - mean) / std::sqrt(var + 1e-5) * wv[i] + bv[i]);
    }
  }
  check_values(norm.forward(x), expected, 1e-4, 1e-5);

  LayerNorm plain({3}, 1e-5, false);
  CHECK(plain.parameters().empty());
  std::vector<double> y = values(plain.forward(x));
  for (int r = 0; r < 8; ++r) {  // every row of 3 has mean 0 and biased variance ~1
    double mean = (y[r * 3] + y[r * 3 + 1] + y[r * 3 + 2]) / 3;
    double var = 0;
    for (int i = 0; i < 3; ++i) var += (y[r * 3 + i] - mean) * (y[r * 3 + i] - mean) / 3;
    CHECK(std::abs(mean) < 1e-5);
    CHECK(std::abs(var - 1) < 1e-3);
  }

  CHECK_THROWS_AS(norm.forward(gw::randn({4, 3, 2}, gen)), gw::ShapeError);
  CHECK_THROWS_WITH(norm.forward(gw::randn({3}, gen)),
                    Catch::Contains("[LayerNorm]") && Catch::Contains("(2,3)"));
  CHECK_THROWS_AS(LayerNorm(gw::Shape{}), gw::InvalidArgumentError);
}
