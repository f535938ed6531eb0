// Finite-difference checks of the views, conversions, cat and the ops built on it, the
// indexing ops and the convolution stack (autograd/functions/shape.cpp, index.cpp, conv.cpp):
// every view, float32<->float64 chains, clone/contiguous, index_select/gather/scatter_add/
// embedding, cat/stack/split/chunk, unfold, conv2d and max_pool2d.
#include "tests/autograd/gradcheck_support.h"

using namespace gwtest;

namespace {
Fn one(std::function<Tensor(const Tensor&)> f) {
  return [f](const std::vector<Tensor>& in) { return f(in[0]); };
}
}  // namespace

TEST_CASE("gradcheck: every view", "[autograd][gradcheck][views]") {
  Tensor x = uniform({2, 3, 4}, 1);
  Tensor m = uniform({3, 4}, 2);
  // Multiplying by a fixed pattern gives each element of the view its own weight, so a
  // gradient routed to the wrong place shows up.
  Tensor weights = make(sample(24, 3, 0.5, 2.0), {2, 3, 4});
  expect_gradcheck("reshape (contiguous)", one([](auto& t) { return t.reshape({4, 6}); }), {x});
  expect_gradcheck("reshape -1", one([](auto& t) { return gw::reshape(t, {-1}); }), {x});
  expect_gradcheck("reshape of a transposed tensor (copy)",
                   one([](auto& t) { return t.transpose(0, 2).reshape({4, 6}); }), {x});
  expect_gradcheck("view", one([](auto& t) { return t.view({6, 4}); }), {x});
  expect_gradcheck("view then weight",
                   one([weights](auto& t) { return t.view({2, 12}) * weights.view({2, 12}); }),
                   {x});
  expect_gradcheck("transpose(0, 2)", one([](auto& t) { return gw::transpose(t, 0, 2); }), {x});
  expect_gradcheck("transpose(-1, -2)", one([](auto& t) { return t.transpose(-1, -2); }), {x});
  expect_gradcheck("permute (2, 0, 1)", one([](auto& t) { return t.permute({2, 0, 1}); }), {x});
  expect_gradcheck("permute weighted",
                   one([weights](auto& t) {
                     return gw::permute(t, {1, 2, 0}) * weights.permute({1, 2, 0});
                   }),
                   {x});
  expect_gradcheck("slice step 2", one([](auto& t) { return t.slice(2, 0, 4, 2); }), {x});
  expect_gradcheck("slice step 3 from 1", one([](auto& t) { return t.slice(2, 1, 4, 3); }), {x});
  expect_gradcheck("slice negative start", one([](auto& t) { return t.slice(1, -2, 3); }), {x});
  expect_gradcheck("slice of a slice",
                   one([](auto& t) { return t.slice(2, 0, 4, 2).slice(1, 1, 3); }), {x});
  expect_gradcheck("narrow", one([](auto& t) { return gw::narrow(t, 1, 1, 2); }), {x});
  expect_gradcheck("narrow negative start", one([](auto& t) { return t.narrow(2, -3, 2); }), {x});
  expect_gradcheck("select", one([](auto& t) { return gw::select(t, 1, 2); }), {x});
  expect_gradcheck("select negative index", one([](auto& t) { return t.select(0, -1); }), {x});
  expect_gradcheck("operator[]", one([](auto& t) { return t[1][2]; }), {x});
  expect_gradcheck("select down to 0-dim", one([](auto& t) { return t[1][0][3] * 3.0; }), {x});
  expect_gradcheck("expand with new dims",
                   one([](auto& t) { return t.expand({2, 3, 4}); }), {uniform({3, 1}, 4)});
  expect_gradcheck("expand -1", one([](auto& t) { return gw::expand(t, {2, -1, 3}); }),
                   {uniform({1, 4, 1}, 5)});
  expect_gradcheck("expand weighted",
                   one([weights](auto& t) { return t.expand({2, 3, 4}) * weights; }),
                   {uniform({1, 3, 1}, 6)});
  expect_gradcheck("expand_as",
                   one([weights](auto& t) { return t.expand_as(weights) * weights; }),
                   {uniform({4}, 7)});
  expect_gradcheck("broadcast_to", one([](auto& t) { return gw::broadcast_to(t, {3, 2, 2}); }),
                   {uniform({2, 1}, 8)});
  expect_gradcheck("expand a 0-dim", one([](auto& t) { return t.expand({2, 3}); }),
                   {uniform({}, 9)});
  Tensor ones_dims = uniform({1, 3, 1, 2}, 10);
  expect_gradcheck("squeeze()", one([](auto& t) { return gw::squeeze(t); }), {ones_dims});
  expect_gradcheck("squeeze(2)", one([](auto& t) { return t.squeeze(2); }), {ones_dims});
  expect_gradcheck("squeeze(-1) of a non-1 dim", one([](auto& t) { return t.squeeze(-1); }),
                   {ones_dims});
  expect_gradcheck("unsqueeze(-1)", one([](auto& t) { return gw::unsqueeze(t, -1); }), {m});
  expect_gradcheck("unsqueeze(0)", one([](auto& t) { return t.unsqueeze(0); }), {m});
  expect_gradcheck("flatten()", one([](auto& t) { return gw::flatten(t); }), {x});
  expect_gradcheck("flatten(1, 2)", one([](auto& t) { return t.flatten(1, 2); }), {x});
  expect_gradcheck("flatten of a transposed tensor",
                   one([](auto& t) { return t.transpose(0, 1).flatten(0, 1); }), {x});
  expect_gradcheck("t()", one([](auto& t) { return t.t(); }), {m});
  expect_gradcheck("t() of a 1-D", one([](auto& t) { return t.t() * 2.0; }), {uniform({3}, 11)});
  expect_gradcheck("a chain of views",
                   one([](auto& t) {
                     return t.t().slice(0, 1, 4).unsqueeze(0).expand({2, 3, 3}).permute(
                                {2, 0, 1}).select(1, 1);
                   }),
                   {m});
  expect_gradcheck("select and slice of an expanded tensor",
                   one([](auto& t) {
                     Tensor e = t.expand({3, 4});
                     return e.select(1, 2) + e.slice(1, 1, 4, 2).sum({1}) * 2.0;
                   }),
                   {uniform({3, 1}, 12)});
  expect_gradcheck("overlapping views summed",
                   one([](auto& t) { return t.narrow(1, 0, 3) + t.narrow(1, 1, 3) * 2.0; }), {m});
}

TEST_CASE("gradcheck: dtype conversions, clone, contiguous", "[autograd][gradcheck][views]") {
  Tensor x = uniform({2, 3}, 20);
  // A float32 hop rounds the function; a wide eps keeps the rounding out of the quotient.
  gw::autograd::GradcheckOptions loose;
  loose.eps = 1e-3;
  loose.atol = 1e-3;
  loose.rtol = 1e-3;
  expect_gradcheck("to(float32).to(float64)",
                   one([](auto& t) { return t.to(gw::kFloat32).to(gw::kFloat64) * 3.0; }), {x},
                   loose);
  expect_gradcheck("float64 -> float32 math -> float64",
                   one([](auto& t) {
                     Tensor f = t.to(gw::kFloat32);
                     return (f * f + f).to(gw::kFloat64);
                   }),
                   {x}, loose);
  expect_gradcheck("to(float64) no-op", one([](auto& t) { return t.to(gw::kFloat64) * 2.0; }),
                   {x});
  expect_gradcheck("clone", one([](auto& t) { return t.clone() * 2.0; }), {x});
  expect_gradcheck("contiguous of a transposed view",
                   one([](auto& t) { return t.t().contiguous(); }), {x});
  expect_gradcheck("contiguous of a contiguous tensor",
                   one([](auto& t) { return t.contiguous() * t; }), {x});

  SECTION("a float32 leaf through float64 math gets a float32 gradient") {
    Tensor f = gw::from_vector<float>({1.0f, 2.0f, 3.0f}).requires_grad_();
    Tensor d = f.to(gw::kFloat64);
    CHECK(d.dtype() == gw::kFloat64);
    (d * d).sum().backward();
    REQUIRE(f.grad().defined());
    CHECK(f.grad().dtype() == gw::kFloat32);
    CHECK(vec(f.grad()) == std::vector<double>{2.0, 4.0, 6.0});
  }
  SECTION("a float64 leaf through float32 math gets a float64 gradient") {
    Tensor d = leaf({0.5, 1.5}, {2});
    Tensor f = d.to(gw::kFloat32);
    (f * 4.0f).sum().backward();
    CHECK(d.grad().dtype() == gw::kFloat64);
    CHECK(vec(d.grad()) == std::vector<double>{4.0, 4.0});
  }
}

TEST_CASE("gradcheck: index_select, gather, embedding", "[autograd][gradcheck][index]") {
  Tensor x = uniform({3, 4}, 30);
  Tensor rows = int_index({2, 0, 2});
  Tensor cols = int_index({3, 1, 1, 0, 3});
  expect_gradcheck("index_select dim 0 with repeats",
                   one([rows](auto& t) { return gw::index_select(t, 0, rows); }), {x});
  expect_gradcheck("index_select dim 1 with repeats",
                   one([cols](auto& t) { return gw::index_select(t, 1, cols); }), {x});
  expect_gradcheck("index_select dim -1 of a 3-D",
                   one([](auto& t) { return gw::index_select(t, -1, int_index({1, 1})); }),
                   {uniform({2, 3, 2}, 31)});
  expect_gradcheck("index_select with an int32 index",
                   one([](auto& t) {
                     return gw::index_select(t, 0, gw::from_vector<int32_t>({1, 1, 0}));
                   }),
                   {x});
  expect_gradcheck("index_select of a transposed view",
                   one([rows](auto& t) { return gw::index_select(t.t(), 1, rows); }), {x});

  Tensor gidx = int_index({0, 0, 3, 2, 1, 1}, {3, 2});
  expect_gradcheck("gather dim 1 with repeats",
                   one([gidx](auto& t) { return gw::gather(t, 1, gidx); }), {x});
  Tensor gidx0 = int_index({2, 0, 1, 2, 2, 2}, {2, 3});  // smaller than x outside dim 0
  expect_gradcheck("gather dim 0 with a smaller index",
                   one([gidx0](auto& t) { return gw::gather(t, 0, gidx0); }), {x});
  expect_gradcheck("gather dim -1 of a 3-D",
                   one([](auto& t) {
                     return gw::gather(t, -1, int_index({1, 0, 0, 0, 1, 1, 1, 0}, {2, 2, 2}));
                   }),
                   {uniform({2, 3, 2}, 32)});

  Tensor ids = int_index({4, 0, 4, 1, 1, 1}, {2, 3});
  expect_gradcheck("embedding with repeated ids",
                   one([ids](auto& t) { return gw::embedding(t, ids); }), {uniform({5, 3}, 33)});
  expect_gradcheck("embedding with 1-D ids",
                   one([](auto& t) { return gw::embedding(t, int_index({2, 2, 0})); }),
                   {uniform({4, 2}, 34)});
  // Hand-computed: each row's gradient counts its uses.
  Tensor w = uniform({5, 3}, 35);
  gw::embedding(w, ids).sum().backward();
  CHECK(vec(w.grad()) ==
        std::vector<double>{1, 1, 1, 3, 3, 3, 0, 0, 0, 0, 0, 0, 2, 2, 2});
}

TEST_CASE("gradcheck: scatter_add w.r.t. self and src", "[autograd][gradcheck][index]") {
  Tensor self = uniform({3, 4}, 40);
  Tensor src = uniform({2, 4}, 41);
  Tensor idx = int_index({2, 0, 2, 1, 2, 2, 0, 1}, {2, 4});  // repeats along dim 0
  auto scatter0 = [idx](const std::vector<Tensor>& in) {
    return gw::scatter_add(in[0], 0, idx, in[1]);
  };
  expect_gradcheck("scatter_add dim 0 (self and src)", scatter0, {self, src});
  Tensor constant_self = make(sample(12, 42, -1, 1), {3, 4});
  expect_gradcheck("scatter_add, src only",
                   [idx, constant_self](const std::vector<Tensor>& in) {
                     return gw::scatter_add(constant_self, 0, idx, in[0]);
                   },
                   {src});
  Tensor constant_src = make(sample(8, 43, -1, 1), {2, 4});
  expect_gradcheck("scatter_add, self only",
                   [idx, constant_src](const std::vector<Tensor>& in) {
                     return gw::scatter_add(in[0], 0, idx, constant_src);
                   },
                   {self});
  Tensor idx1 = int_index({3, 3, 0, 1, 1, 1}, {3, 2});
  expect_gradcheck("scatter_add dim 1 with repeats",
                   [idx1](const std::vector<Tensor>& in) {
                     return gw::scatter_add(in[0], 1, idx1, in[1]);
                   },
                   {uniform({3, 4}, 44), uniform({3, 2}, 45)});
  // src larger than index (allowed, as in PyTorch): the unused part of src gets zero gradient.
  Tensor small_idx = int_index({1, 0, 2, 2}, {2, 2});
  expect_gradcheck("scatter_add with src larger than index",
                   [small_idx](const std::vector<Tensor>& in) {
                     return gw::scatter_add(in[0], 0, small_idx, in[1]);
                   },
                   {uniform({3, 4}, 46), uniform({3, 3}, 47)});
}

TEST_CASE("gradcheck: cat, stack, split, chunk", "[autograd][gradcheck][shape]") {
  Tensor a = uniform({2, 3}, 50), b = uniform({1, 3}, 51), c = uniform({2, 3}, 52);
  Tensor d = uniform({2, 2}, 53);
  Tensor constant = make(sample(6, 54, -1, 1), {2, 3});
  expect_gradcheck("cat dim 0 of three",
                   [](const std::vector<Tensor>& in) { return gw::cat({in[0], in[1], in[2]}, 0); },
                   {a, b, c});
  expect_gradcheck("cat dim 1",
                   [](const std::vector<Tensor>& in) { return gw::cat({in[0], in[1]}, 1); },
                   {a, d});
  expect_gradcheck("cat dim -1 with a constant in the middle",
                   [constant](const std::vector<Tensor>& in) {
                     return gw::cat({in[0], constant, in[1]}, -1);
                   },
                   {a, c});
  expect_gradcheck("cat with a 1-D empty tensor (skipped)",
                   [](const std::vector<Tensor>& in) {
                     return gw::cat({in[0], gw::zeros({0}, gw::kFloat64), in[1]}, 0);
                   },
                   {a, c});
  expect_gradcheck("cat of non-contiguous views",
                   [](const std::vector<Tensor>& in) {
                     return gw::cat({in[0].t(), in[1].t()}, 1);
                   },
                   {a, c});
  for (int64_t dim : {0, 1, 2, -1}) {
    expect_gradcheck("stack dim " + std::to_string(dim),
                     [dim](const std::vector<Tensor>& in) {
                       return gw::stack({in[0], in[1], in[0]}, dim);
                     },
                     {a, c});
  }
  Tensor x = uniform({4, 5}, 55);
  // Each part is weighted by its position so that swapped parts show up.
  auto weighted = [](const std::vector<Tensor>& parts) {
    std::vector<Tensor> flat;
    for (size_t i = 0; i < parts.size(); ++i) {
      flat.push_back(parts[i].flatten() * static_cast<double>(i + 1));
    }
    return gw::cat(flat, 0);
  };
  expect_gradcheck("split size 2 along dim 1 (last shorter)",
                   [weighted](const std::vector<Tensor>& in) {
                     return weighted(gw::split(in[0], 2, 1));
                   },
                   {x});
  expect_gradcheck("split sizes {1, 3} along dim 0",
                   [weighted](const std::vector<Tensor>& in) {
                     return weighted(gw::split(in[0], std::vector<int64_t>{1, 3}, 0));
                   },
                   {x});
  expect_gradcheck("chunk 3 along dim 1 (uneven)",
                   [weighted](const std::vector<Tensor>& in) {
                     return weighted(gw::chunk(in[0], 3, 1));
                   },
                   {x});
  expect_gradcheck("chunk 2 along dim 0, one part used",
                   [](const std::vector<Tensor>& in) { return gw::chunk(in[0], 2, 0)[1] * 2.0; },
                   {x});
  SECTION("cat of float32 and float64 gives each input its own dtype back") {
    Tensor f = gw::from_vector<float>({1.0f, 2.0f}).requires_grad_();
    Tensor g = leaf({3.0, 4.0, 5.0}, {3});
    Tensor y = gw::cat({f, g}, 0);
    CHECK(y.dtype() == gw::kFloat64);
    gw::autograd::backward({y}, {make({1, 2, 3, 4, 5}, {5})});
    CHECK(f.grad().dtype() == gw::kFloat32);
    CHECK(g.grad().dtype() == gw::kFloat64);
    CHECK(vec(f.grad()) == std::vector<double>{1, 2});
    CHECK(vec(g.grad()) == std::vector<double>{3, 4, 5});
  }
}

TEST_CASE("gradcheck: unfold", "[autograd][gradcheck][conv]") {
  Tensor x = uniform({1, 2, 4, 5}, 60);
  expect_gradcheck("unfold kernel 2x2",
                   one([](auto& t) { return gw::unfold(t, {2, 2}); }), {uniform({1, 2, 3, 3}, 61)});
  gw::Conv2dOptions o;
  o.stride = {2, 1};
  o.padding = {1, 0};
  o.dilation = {1, 2};
  expect_gradcheck("unfold kernel 2x3 stride (2,1) padding (1,0) dilation (1,2)",
                   one([o](auto& t) { return gw::unfold(t, {2, 3}, o); }), {x});
  gw::Conv2dOptions overlap;
  overlap.padding = {1, 1};
  expect_gradcheck("unfold kernel 3x3 padding 1 (overlapping windows)",
                   one([overlap](auto& t) { return gw::unfold(t, {3, 3}, overlap); }),
                   {uniform({1, 1, 3, 3}, 62)});
}

TEST_CASE("gradcheck: conv2d", "[autograd][gradcheck][conv]") {
  auto conv = [](gw::Conv2dOptions o, bool bias) -> Fn {
    return [o, bias](const std::vector<Tensor>& in) {
      return gw::conv2d(in[0], in[1], bias ? in[2] : Tensor(), o);
    };
  };
  expect_gradcheck("conv2d 3x3, bias", conv({}, true),
                   {uniform({2, 2, 4, 4}, 70), uniform({3, 2, 3, 3}, 71), uniform({3}, 72)});
  expect_gradcheck("conv2d without bias", conv({}, false),
                   {uniform({1, 2, 4, 3}, 73), uniform({2, 2, 2, 2}, 74)});
  gw::Conv2dOptions strided;
  strided.stride = {2, 1};
  strided.padding = {1, 2};
  expect_gradcheck("conv2d stride (2,1) padding (1,2)", conv(strided, true),
                   {uniform({1, 2, 5, 4}, 75), uniform({2, 2, 3, 2}, 76), uniform({2}, 77)});
  gw::Conv2dOptions dilated;
  dilated.dilation = {2, 1};
  dilated.padding = {1, 0};
  expect_gradcheck("conv2d dilation (2,1) padding (1,0)", conv(dilated, true),
                   {uniform({1, 1, 5, 4}, 78), uniform({2, 1, 2, 3}, 79), uniform({2}, 80)});
  gw::Conv2dOptions all;
  all.stride = {2, 2};
  all.padding = {1, 1};
  all.dilation = {2, 2};
  expect_gradcheck("conv2d stride 2 padding 1 dilation 2", conv(all, false),
                   {uniform({2, 1, 6, 6}, 81), uniform({2, 1, 2, 2}, 82)});
  expect_gradcheck("conv2d of a permuted (channels-last) input",
                   [](const std::vector<Tensor>& in) {
                     return gw::conv2d(in[0].permute({0, 3, 1, 2}), in[1], in[2]);
                   },
                   {uniform({1, 4, 4, 2}, 83), uniform({2, 2, 2, 2}, 84), uniform({2}, 85)});
}

TEST_CASE("gradcheck: max_pool2d", "[autograd][gradcheck][conv]") {
  expect_gradcheck("max_pool2d 2x2",
                   one([](auto& t) { return gw::max_pool2d(t, {2, 2}); }), {distinct({1, 2, 4, 4}, 90)});
  expect_gradcheck("max_pool2d 3x3 stride 2 padding 1",
                   one([](auto& t) { return gw::max_pool2d(t, {3, 3}, {2, 2}, {1, 1}); }),
                   {distinct({1, 2, 5, 5}, 91)});
  expect_gradcheck("max_pool2d 2x3 stride (1,2) padding (1,1), overlapping",
                   one([](auto& t) { return gw::max_pool2d(t, {2, 3}, {1, 2}, {1, 1}); }),
                   {distinct({2, 1, 4, 5}, 92)});
  // Hand-computed: with padding and only negative values, the padded taps never win.
  Tensor x = leaf({-4, -3, -2, -1}, {1, 1, 2, 2});
  gw::max_pool2d(x, {2, 2}, {1, 1}, {1, 1}).sum().backward();
  // Output (3,3): corners see one element each, edges two, the centre all four.
  // Winners: (0,0)->-4, (0,1)->-3, (0,2)->-3, (1,0)->-2, (1,1)->-1, (1,2)->-1,
  // (2,0)->-2, (2,1)->-1, (2,2)->-1.
  CHECK(vec(x.grad()) == std::vector<double>{1, 2, 2, 4});
}
