// Finite-difference checks (float64) of every functional op and layer in nn.
#include <catch2/catch.hpp>

#include "nn_test_util.h"

using gw::Tensor;
using namespace gw::nn;
namespace F = gw::nn::functional;
using F::Reduction;
using nn_test::randn64;
using Inputs = std::vector<Tensor>;

TEST_CASE("gradcheck: activations and softmax", "[nn][gradcheck]") {
  gw::Generator gen(40);
  // Values away from relu's kink, where finite differences would straddle it.
  Tensor x = randn64({3, 4}, gen, false);
  {
    gw::autograd::NoGradGuard no_grad;
    x = (x + gw::sign(x) * 0.1).detach();
  }
  x.requires_grad_();
  NN_GRADCHECK([](const Inputs& in) { return F::relu(in[0]); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::gelu(in[0]); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::gelu(in[0], "tanh"); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::tanh(in[0]); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::sigmoid(in[0]); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::softmax(in[0], 1); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::log_softmax(in[0], 0); }, Inputs{x});
  NN_GRADCHECK([](const Inputs& in) { return F::flatten(in[0]); }, Inputs{x});
}

TEST_CASE("gradcheck: dropout with a fixed mask", "[nn][gradcheck]") {
  gw::Generator gen(41);
  Tensor x = randn64({4, 5}, gen);
  // A fresh generator with the same seed per call: every evaluation draws the same mask.
  auto fn = [](const Inputs& in) {
    gw::Generator g(1234);
    return F::dropout(in[0], 0.4, true, g);
  };
  NN_GRADCHECK(fn, Inputs{x});
  // The gradient is the mask scaled by 1/(1-p): zero exactly where the output is zero.
  Tensor y = fn({x});
  y.sum().backward();
  std::vector<double> out = nn_test::values(y), grad = nn_test::values(x.grad());
  int dropped = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0) {
      ++dropped;
      CHECK(grad[i] == 0);
    } else {
      CHECK(grad[i] == Approx(1 / 0.6));
    }
  }
  CHECK(dropped > 0);
}

TEST_CASE("gradcheck: linear, embedding and layer_norm", "[nn][gradcheck]") {
  gw::Generator gen(42);
  Tensor x = randn64({3, 4}, gen), w = randn64({2, 4}, gen), b = randn64({2}, gen);
  NN_GRADCHECK([](const Inputs& in) { return F::linear(in[0], in[1], in[2]); }, (Inputs{x, w, b}));
  NN_GRADCHECK([](const Inputs& in) { return F::linear(in[0], in[1]); }, (Inputs{x, w}));
  // Leading batch dims broadcast the weight.
  Tensor x3 = randn64({2, 3, 4}, gen);
  NN_GRADCHECK([](const Inputs& in) { return F::linear(in[0], in[1], in[2]); }, (Inputs{x3, w, b}));

  Tensor table = randn64({5, 3}, gen);
  Tensor idx = gw::from_vector<int64_t>({4, 1, 1, 0}, {2, 2});  // a repeated row sums
  NN_GRADCHECK([idx](const Inputs& in) { return F::embedding(idx, in[0]); }, Inputs{table});

  Tensor z = randn64({3, 2, 4}, gen), lw = randn64({2, 4}, gen), lb = randn64({2, 4}, gen);
  NN_GRADCHECK(
      [](const Inputs& in) {
        return F::layer_norm(in[0], {2, 4}, in[1], in[2], 1e-5);
      },
      (Inputs{z, lw, lb}));
  NN_GRADCHECK([](const Inputs& in) { return F::layer_norm(in[0], {4}); }, Inputs{z});
}

TEST_CASE("gradcheck: conv2d with stride, padding and dilation", "[nn][gradcheck]") {
  gw::Generator gen(43);
  Tensor x = randn64({2, 2, 6, 5}, gen), w = randn64({3, 2, 3, 2}, gen), b = randn64({3}, gen);
  gw::Conv2dOptions opts{.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 1}};
  NN_GRADCHECK([opts](const Inputs& in) { return F::conv2d(in[0], in[1], in[2], opts); },
               (Inputs{x, w, b}));
  NN_GRADCHECK([](const Inputs& in) { return F::conv2d(in[0], in[1]); }, (Inputs{x, w}));
  // A non-contiguous (transposed) input, and an unbatched (C,H,W) one.
  Tensor xt = randn64({1, 2, 4, 5}, gen), xu = randn64({2, 4, 3}, gen);
  NN_GRADCHECK([](const Inputs& in) { return F::conv2d(in[0].transpose(2, 3), in[1]); },
               (Inputs{xt, w}));
  gw::Conv2dOptions pad{.padding = {1, 0}};
  NN_GRADCHECK([pad](const Inputs& in) { return F::conv2d(in[0], in[1], {}, pad); },
               (Inputs{xu, w}));
}

TEST_CASE("gradcheck: max_pool2d with stride and padding", "[nn][gradcheck]") {
  gw::Generator gen(44);
  // Distinct, well separated values: a nudge of eps never changes which element is the max.
  Tensor x = gw::randperm(2 * 2 * 5 * 6, gen).to(gw::kFloat64).reshape({2, 2, 5, 6}) * 0.1;
  x = x.detach().contiguous().requires_grad_();
  NN_GRADCHECK([](const Inputs& in) { return F::max_pool2d(in[0], {2, 2}); }, Inputs{x});
  NN_GRADCHECK(
      [](const Inputs& in) {
        return F::max_pool2d(in[0], {3, 3}, {2, 1}, {1, 1});
      },
      Inputs{x});
  NN_GRADCHECK(
      [](const Inputs& in) {
        return F::max_pool2d(in[0].transpose(2, 3), {2, 3});
      },
      Inputs{x});
}

TEST_CASE("gradcheck: losses", "[nn][gradcheck]") {
  gw::Generator gen(45);
  Tensor x = randn64({4, 3}, gen), t = randn64({4, 3}, gen);
  Tensor y = gw::from_vector<int64_t>({2, 0, 1, 2});
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    NN_GRADCHECK([r](const Inputs& in) { return F::mse_loss(in[0], in[1], r); }, (Inputs{x, t}));
    NN_GRADCHECK([y, r](const Inputs& in) { return F::cross_entropy(in[0], y, r); }, Inputs{x});
    NN_GRADCHECK([y, r](const Inputs& in) { return F::nll_loss(in[0], y, r); }, Inputs{x});
  }
  Tensor x3 = randn64({2, 3, 2}, gen);
  Tensor y3 = gw::from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  NN_GRADCHECK([y3](const Inputs& in) { return F::cross_entropy(in[0], y3); }, Inputs{x3});
  NN_GRADCHECK([y3](const Inputs& in) { return F::nll_loss(F::log_softmax(in[0], 1), y3); },
               Inputs{x3});
}

TEST_CASE("gradcheck: layers through their parameters", "[nn][gradcheck]") {
  gw::Generator gen(46);
  SECTION("Linear") {
    Linear fc(4, 3, gen);
    fc.to(gw::kFloat64);
    NN_GRADCHECK([&fc](const Inputs& in) { return fc.forward(in[0]); },
                 (Inputs{randn64({2, 4}, gen), fc.weight, fc.bias}));
  }
  SECTION("Conv2d") {
    Conv2d conv(2, 3, {2, 3}, {.stride = {1, 2}, .padding = {1, 1}}, gen);
    conv.to(gw::kFloat64);
    NN_GRADCHECK([&conv](const Inputs& in) { return conv.forward(in[0]); },
                 (Inputs{randn64({1, 2, 4, 5}, gen), conv.weight, conv.bias}));
  }
  SECTION("LayerNorm") {
    LayerNorm norm(5);
    norm.to(gw::kFloat64);
    NN_GRADCHECK([&norm](const Inputs& in) { return norm.forward(in[0]); },
                 (Inputs{randn64({3, 5}, gen), norm.weight, norm.bias}));
  }
  SECTION("Embedding") {
    Embedding emb(6, 2, gen);
    emb.to(gw::kFloat64);
    Tensor idx = gw::from_vector<int64_t>({5, 0, 5});
    NN_GRADCHECK([&emb, idx](const Inputs&) { return emb.forward(idx); }, Inputs{emb.weight});
  }
  SECTION("Sequential MLP with a cross_entropy loss") {
    Sequential mlp(std::make_shared<Linear>(3, 4, gen), std::make_shared<Tanh>(),
                   std::make_shared<Linear>(4, 3, gen));
    mlp.to(gw::kFloat64);
    Tensor y = gw::from_vector<int64_t>({1, 0});
    Inputs in = {randn64({2, 3}, gen)};
    for (const Tensor& p : mlp.parameters()) in.push_back(p);
    NN_GRADCHECK([&mlp, y](const Inputs& in) { return F::cross_entropy(mlp.forward(in[0]), y); },
                 in);
  }
}
