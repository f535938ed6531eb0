// Finite-difference checks of the reductions, softmax and the matrix products
// (autograd/functions/reduce.cpp, linalg.cpp and the composites built on them): every
// reduction over all and given dims with and without keepdim, the extremes' tie conventions
// (hand-computed), softmax/log_softmax on every dim, and mm/bmm/matmul/dot/linear for every
// rank combination with transposed, sliced and batch-broadcast operands.
#include "tests/autograd/gradcheck_support.h"

using namespace gwtest;

namespace {

// The dims lists every reduction is checked over, on a (2,3,4) input.
const std::vector<Shape>& dim_lists() {
  static const std::vector<Shape> dims = {{0}, {1}, {-1}, {0, 2}, {1, 2}, {0, 1, 2}};
  return dims;
}

std::string label(const std::string& op, const Shape& dims, bool keepdim) {
  return op + " dims " + gw::shape_str(dims) + (keepdim ? " keepdim" : "");
}

}  // namespace

TEST_CASE("gradcheck: sum and mean", "[autograd][gradcheck][reduce]") {
  Tensor x = uniform({2, 3, 4}, 1);
  expect_gradcheck("sum()", [](const std::vector<Tensor>& in) { return gw::sum(in[0]); }, {x});
  expect_gradcheck("mean()", [](const std::vector<Tensor>& in) { return gw::mean(in[0]); }, {x});
  expect_gradcheck("Tensor::sum()", [](const std::vector<Tensor>& in) { return in[0].sum(); },
                   {x});
  for (const Shape& dims : dim_lists()) {
    for (bool keepdim : {false, true}) {
      expect_gradcheck(label("sum", dims, keepdim),
                       [dims, keepdim](const std::vector<Tensor>& in) {
                         return gw::sum(in[0], dims, keepdim);
                       },
                       {x});
      expect_gradcheck(label("mean", dims, keepdim),
                       [dims, keepdim](const std::vector<Tensor>& in) {
                         return gw::mean(in[0], dims, keepdim);
                       },
                       {x});
    }
  }
  Tensor s = uniform({}, 2);
  expect_gradcheck("sum of a 0-dim", [](const std::vector<Tensor>& in) { return gw::sum(in[0]); },
                   {s});
  expect_gradcheck("mean of a transposed view",
                   [](const std::vector<Tensor>& in) { return gw::mean(in[0].t(), {1}); },
                   {uniform({3, 4}, 3)});
}

TEST_CASE("gradcheck: prod without zeros", "[autograd][gradcheck][reduce]") {
  Tensor x = nonzero({2, 3, 4}, 10);
  expect_gradcheck("prod()", [](const std::vector<Tensor>& in) { return gw::prod(in[0]); }, {x});
  for (const Shape& dims : dim_lists()) {
    for (bool keepdim : {false, true}) {
      expect_gradcheck(label("prod", dims, keepdim),
                       [dims, keepdim](const std::vector<Tensor>& in) {
                         return gw::prod(in[0], dims, keepdim);
                       },
                       {x});
    }
  }
}

TEST_CASE("gradcheck: max, min, amax, amin without ties", "[autograd][gradcheck][reduce]") {
  Tensor x = distinct({2, 3, 4}, 20);
  expect_gradcheck("max()", [](const std::vector<Tensor>& in) { return gw::max(in[0]); }, {x});
  expect_gradcheck("min()", [](const std::vector<Tensor>& in) { return gw::min(in[0]); }, {x});
  expect_gradcheck("Tensor::max()", [](const std::vector<Tensor>& in) { return in[0].max(); },
                   {x});
  for (const Shape& dims : dim_lists()) {
    for (bool keepdim : {false, true}) {
      expect_gradcheck(label("amax", dims, keepdim),
                       [dims, keepdim](const std::vector<Tensor>& in) {
                         return gw::amax(in[0], dims, keepdim);
                       },
                       {x});
      expect_gradcheck(label("amin", dims, keepdim),
                       [dims, keepdim](const std::vector<Tensor>& in) {
                         return gw::amin(in[0], dims, keepdim);
                       },
                       {x});
    }
  }
}

TEST_CASE("gradcheck: max(dim) and min(dim) values", "[autograd][gradcheck][reduce]") {
  Tensor x = distinct({2, 3, 4}, 30);
  for (int64_t dim : {0, 1, 2, -1}) {
    for (bool keepdim : {false, true}) {
      expect_gradcheck(label("max(dim).values", {dim}, keepdim),
                       [dim, keepdim](const std::vector<Tensor>& in) {
                         return gw::max(in[0], dim, keepdim).values;
                       },
                       {x});
      expect_gradcheck(label("min(dim).values", {dim}, keepdim),
                       [dim, keepdim](const std::vector<Tensor>& in) {
                         return gw::min(in[0], dim, keepdim).values;
                       },
                       {x});
    }
  }
  expect_gradcheck("max(dim) of a 1-D",
                   [](const std::vector<Tensor>& in) { return gw::max(in[0], 0).values; },
                   {distinct({5}, 31)});
  expect_gradcheck("max(dim) of a 0-dim",
                   [](const std::vector<Tensor>& in) { return gw::max(in[0], 0).values; },
                   {uniform({}, 32)});
  expect_gradcheck("max(dim) of a transposed view",
                   [](const std::vector<Tensor>& in) { return gw::max(in[0].t(), 1).values; },
                   {distinct({3, 4}, 33)});
}

TEST_CASE("extremes split ties like PyTorch", "[autograd][reduce]") {
  SECTION("amax/amin share the gradient evenly among the tied elements") {
    Tensor x = leaf({1, 3, 3, 2, 2, 0}, {2, 3});
    gw::amax(x, {1}).sum().backward();
    CHECK(vec(x.grad()) == std::vector<double>{0, 0.5, 0.5, 0.5, 0.5, 0});
    x.set_grad({});
    gw::amin(x, {0}).sum().backward();  // columns (1,2), (3,2), (3,0)
    CHECK(vec(x.grad()) == std::vector<double>{1, 0, 0, 0, 1, 1});
  }
  SECTION("max() and min() of everything share evenly too") {
    Tensor x = leaf({3, 1, 3, 1}, {4});
    (gw::max(x) * 4.0).backward();
    CHECK(vec(x.grad()) == std::vector<double>{2, 0, 2, 0});
    x.set_grad({});
    gw::min(x).backward();
    CHECK(vec(x.grad()) == std::vector<double>{0, 0.5, 0, 0.5});
  }
  SECTION("max(dim) and min(dim) send the gradient to the index they return") {
    Tensor x = leaf({2, 5, 5, 1, 1, 0}, {2, 3});
    gw::ValuesIndices mx = gw::max(x, 1);
    CHECK(mx.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
    gw::autograd::backward({mx.values}, {make({10, 20}, {2})});
    CHECK(vec(x.grad()) == std::vector<double>{0, 10, 0, 20, 0, 0});
    x.set_grad({});
    gw::ValuesIndices mn = gw::min(x, 0, true);
    CHECK(mn.values.sizes() == Shape{1, 3});
    gw::autograd::backward({mn.values}, {make({1, 2, 3}, {1, 3})});
    CHECK(vec(x.grad()) == std::vector<double>{0, 0, 0, 1, 2, 3});
  }
}

TEST_CASE("gradcheck: var and std with corrections", "[autograd][gradcheck][reduce]") {
  Tensor x = uniform({2, 3, 4}, 40);
  for (int64_t correction : {0, 1, 2}) {
    std::string c = " correction " + std::to_string(correction);
    expect_gradcheck("var()" + c,
                     [correction](const std::vector<Tensor>& in) {
                       return gw::var(in[0], {}, correction);
                     },
                     {x});
    expect_gradcheck("std()" + c,
                     [correction](const std::vector<Tensor>& in) {
                       return gw::std(in[0], {}, correction);
                     },
                     {x});
    for (const Shape& dims : std::vector<Shape>{{1}, {-1}, {0, 2}}) {
      for (bool keepdim : {false, true}) {
        expect_gradcheck(label("var", dims, keepdim) + c,
                         [dims, correction, keepdim](const std::vector<Tensor>& in) {
                           return gw::var(in[0], dims, correction, keepdim);
                         },
                         {x});
        expect_gradcheck(label("std", dims, keepdim) + c,
                         [dims, correction, keepdim](const std::vector<Tensor>& in) {
                           return gw::std(in[0], dims, correction, keepdim);
                         },
                         {x});
      }
    }
  }
  // Hand-computed: d var / dx_i = 2 (x_i - mean) / (n - correction).
  Tensor v = leaf({1, 2, 6}, {3});
  gw::var(v).backward();  // mean 3, n - 1 = 2
  CHECK(near(vec(v.grad()), {-2.0, -1.0, 3.0}));
}

TEST_CASE("gradcheck: logsumexp", "[autograd][gradcheck][reduce]") {
  Tensor x = uniform({2, 3, 4}, 50, -3, 3);
  for (const Shape& dims : dim_lists()) {
    for (bool keepdim : {false, true}) {
      expect_gradcheck(label("logsumexp", dims, keepdim),
                       [dims, keepdim](const std::vector<Tensor>& in) {
                         return gw::logsumexp(in[0], dims, keepdim);
                       },
                       {x});
    }
  }
  // Large values: the max shift keeps the gradient (a softmax) finite.
  Tensor big = leaf({1000.0, 1000.0, 0.0}, {3});
  gw::logsumexp(big, {0}).backward();
  CHECK(near(vec(big.grad()), {0.5, 0.5, 0.0}));
}

TEST_CASE("gradcheck: softmax and log_softmax on every dim", "[autograd][gradcheck][reduce]") {
  Tensor x = uniform({2, 3, 4}, 60, -2, 2);
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    std::string d = " dim " + std::to_string(dim);
    expect_gradcheck("softmax" + d,
                     [dim](const std::vector<Tensor>& in) { return gw::softmax(in[0], dim); }, {x});
    expect_gradcheck("log_softmax" + d,
                     [dim](const std::vector<Tensor>& in) { return gw::log_softmax(in[0], dim); },
                     {x});
  }
  Tensor m = uniform({3, 4}, 61, -2, 2);
  expect_gradcheck("softmax of a transposed view",
                   [](const std::vector<Tensor>& in) { return gw::softmax(in[0].t(), 1); }, {m});
  expect_gradcheck("log_softmax of a transposed view",
                   [](const std::vector<Tensor>& in) { return in[0].t().log_softmax(0); }, {m});
  expect_gradcheck("softmax of a 1-D",
                   [](const std::vector<Tensor>& in) { return in[0].softmax(0); },
                   {uniform({5}, 62)});
  expect_gradcheck("log_softmax of a 0-dim",
                   [](const std::vector<Tensor>& in) { return gw::log_softmax(in[0], 0); },
                   {uniform({}, 63)});
  // A loss of the usual form: the gradient of -log_softmax(x)[target] is softmax - onehot.
  Tensor logits = leaf({1.0, 2.0, 3.0}, {3});
  (-gw::log_softmax(logits, 0).select(0, 2)).backward();
  double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  CHECK(near(vec(logits.grad()), {std::exp(1.0) / z, std::exp(2.0) / z, std::exp(3.0) / z - 1.0}));
}

// --- matrix products ---------------------------------------------------------------------------

namespace {
Fn product(std::function<Tensor(const Tensor&, const Tensor&)> f) {
  return [f](const std::vector<Tensor>& in) { return f(in[0], in[1]); };
}
Tensor mat(const Tensor& a, const Tensor& b) { return gw::matmul(a, b); }
}  // namespace

TEST_CASE("gradcheck: mm with plain, transposed and sliced operands",
          "[autograd][gradcheck][linalg]") {
  expect_gradcheck("mm (3,4)@(4,2)", product([](auto& a, auto& b) { return gw::mm(a, b); }),
                   {uniform({3, 4}, 70), uniform({4, 2}, 71)});
  expect_gradcheck("mm a.t() @ b", product([](auto& a, auto& b) { return gw::mm(a.t(), b); }),
                   {uniform({4, 3}, 72), uniform({4, 2}, 73)});
  expect_gradcheck("mm a @ b.t()", product([](auto& a, auto& b) { return gw::mm(a, b.t()); }),
                   {uniform({3, 4}, 74), uniform({2, 4}, 75)});
  expect_gradcheck("mm a.t() @ b.t()",
                   product([](auto& a, auto& b) { return gw::mm(a.t(), b.t()); }),
                   {uniform({4, 3}, 76), uniform({2, 4}, 77)});
  expect_gradcheck("mm with column-sliced (stride 2) a and narrowed b",
                   product([](auto& a, auto& b) {
                     return gw::mm(a.slice(1, 0, 8, 2), b.narrow(1, 1, 2));
                   }),
                   {uniform({3, 8}, 78), uniform({4, 5}, 79)});
  expect_gradcheck("mm with row-sliced a and a transposed, sliced b",
                   product([](auto& a, auto& b) {
                     return gw::mm(a.slice(0, 1, 5, 2), b.t().slice(0, 0, 3));
                   }),
                   {uniform({5, 3}, 80), uniform({2, 4}, 81)});
  expect_gradcheck("Tensor::matmul 2-D", product([](auto& a, auto& b) { return a.matmul(b); }),
                   {uniform({2, 3}, 82), uniform({3, 2}, 83)});
}

TEST_CASE("gradcheck: bmm", "[autograd][gradcheck][linalg]") {
  expect_gradcheck("bmm (2,3,4)@(2,4,2)", product([](auto& a, auto& b) { return gw::bmm(a, b); }),
                   {uniform({2, 3, 4}, 90), uniform({2, 4, 2}, 91)});
  expect_gradcheck("bmm with transposed operands",
                   product([](auto& a, auto& b) {
                     return gw::bmm(a.transpose(1, 2), b.transpose(1, 2));
                   }),
                   {uniform({2, 4, 3}, 92), uniform({2, 2, 4}, 93)});
  expect_gradcheck("bmm with a batch-sliced a",
                   product([](auto& a, auto& b) { return gw::bmm(a.slice(0, 0, 4, 2), b); }),
                   {uniform({4, 2, 3}, 94), uniform({2, 3, 2}, 95)});
}

TEST_CASE("gradcheck: matmul for every rank combination", "[autograd][gradcheck][linalg]") {
  struct Case {
    const char* name;
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {"1-D @ 1-D", {4}, {4}},
      {"1-D @ 2-D", {4}, {4, 2}},
      {"2-D @ 1-D", {3, 4}, {4}},
      {"2-D @ 2-D", {3, 4}, {4, 2}},
      {"1-D @ 3-D", {4}, {2, 4, 3}},
      {"3-D @ 1-D", {2, 3, 4}, {4}},
      {"3-D @ 2-D", {2, 3, 4}, {4, 2}},
      {"2-D @ 3-D", {3, 4}, {2, 4, 2}},
      {"3-D @ 3-D", {2, 3, 4}, {2, 4, 2}},
      {"3-D @ 3-D broadcast batch 1", {1, 3, 4}, {2, 4, 2}},
      {"3-D @ 3-D broadcast batch 1 (rhs)", {2, 3, 4}, {1, 4, 2}},
      {"4-D @ 3-D broadcast batches", {2, 1, 2, 3}, {3, 3, 2}},
      {"4-D @ 4-D broadcast both ways", {2, 1, 2, 3}, {1, 2, 3, 2}},
      {"4-D @ 1-D", {2, 2, 2, 3}, {3}},
      {"1-D @ 4-D", {3}, {2, 1, 3, 2}},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    expect_gradcheck(std::string("matmul ") + c.name, product(mat),
                     {uniform(c.a, seed, -1, 1), uniform(c.b, seed + 1, -1, 1)});
    seed += 2;
  }
}

TEST_CASE("gradcheck: matmul of non-contiguous operands", "[autograd][gradcheck][linalg]") {
  expect_gradcheck("3-D transposed @ 2-D (batched path)",
                   product([](auto& a, auto& b) { return gw::matmul(a.transpose(1, 2), b); }),
                   {uniform({2, 4, 3}, 130), uniform({4, 2}, 131)});
  expect_gradcheck("3-D transposed @ 1-D",
                   product([](auto& a, auto& b) { return gw::matmul(a.transpose(1, 2), b); }),
                   {uniform({2, 4, 3}, 140), uniform({4}, 141)});
  expect_gradcheck("3-D @ 2-D transposed (folded path)",
                   product([](auto& a, auto& b) { return gw::matmul(a, b.t()); }),
                   {uniform({2, 3, 4}, 132), uniform({2, 4}, 133)});
  expect_gradcheck("2-D sliced @ 3-D transposed",
                   product([](auto& a, auto& b) {
                     return gw::matmul(a.slice(1, 0, 6, 2), b.transpose(-1, -2));
                   }),
                   {uniform({2, 6}, 134), uniform({2, 2, 3}, 135)});
  expect_gradcheck("permuted 4-D @ expanded 3-D",
                   product([](auto& a, auto& b) {
                     return gw::matmul(a.permute({1, 0, 3, 2}), b.expand({2, 3, 2}));
                   }),
                   {uniform({2, 2, 3, 2}, 136), uniform({1, 3, 2}, 137)});
  expect_gradcheck("1-D strided @ 2-D transposed",
                   product([](auto& a, auto& b) { return gw::matmul(a.slice(0, 0, 6, 2), b.t()); }),
                   {uniform({6}, 138), uniform({2, 3}, 139)});
}

TEST_CASE("gradcheck: dot and linear", "[autograd][gradcheck][linalg]") {
  expect_gradcheck("dot", product([](auto& a, auto& b) { return gw::dot(a, b); }),
                   {uniform({5}, 140), uniform({5}, 141)});
  expect_gradcheck("dot of strided views",
                   product([](auto& a, auto& b) {
                     return gw::dot(a.slice(0, 1, 7, 2), b.select(1, 0));
                   }),
                   {uniform({7}, 142), uniform({3, 2}, 143)});
  auto with_bias = [](const std::vector<Tensor>& in) { return gw::linear(in[0], in[1], in[2]); };
  auto no_bias = [](const std::vector<Tensor>& in) { return gw::linear(in[0], in[1]); };
  expect_gradcheck("linear (3,4) weight (2,4) bias (2)", with_bias,
                   {uniform({3, 4}, 144), uniform({2, 4}, 145), uniform({2}, 146)});
  expect_gradcheck("linear without bias", no_bias, {uniform({3, 4}, 147), uniform({2, 4}, 148)});
  expect_gradcheck("linear of a 1-D input", with_bias,
                   {uniform({4}, 149), uniform({3, 4}, 150), uniform({3}, 151)});
  expect_gradcheck("linear of a 3-D input", with_bias,
                   {uniform({2, 2, 3}, 152), uniform({2, 3}, 153), uniform({2}, 154)});
  // Hand-computed: y = x W^T + b summed gives dW = 1^T x, db = count of rows.
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = uniform({2, 3}, 155), b = uniform({2}, 156);
  gw::linear(x, w, b).sum().backward();
  CHECK(vec(w.grad()) == std::vector<double>{5, 7, 9, 5, 7, 9});
  CHECK(vec(b.grad()) == std::vector<double>{2, 2});
  CHECK(w.grad().is_contiguous());  // .grad of a weight read transposed is still row-major
}

TEST_CASE("a float32 Linear's weight and bias gradients are dYᵀ x and dY's column sums",
          "[autograd][linalg]") {
  // The rule takes both from one read of dY where the GEMM can (detail::mm_and_row_sums):
  // the bits of the two ops it stands for, as when it cannot (one of them alone, below).
  // 200 rows of 40 (past a GEMM tile and a k block).
  gw::Generator gen(7);
  const Tensor x = gw::randn({200, 30}, gen), dy = gw::randn({200, 40}, gen);
  Tensor w = gw::randn({40, 30}, gen).requires_grad_(), b = gw::randn({40}, gen).requires_grad_();
  gw::linear(x, w, b).backward(dy);
  CHECK(gw::equal(b.grad(), gw::sum(dy, {0})));
  CHECK(gw::equal(w.grad(), gw::mm(dy.t(), x)));
  CHECK(w.grad().is_contiguous());
  // Only the weight's, or only the bias's: the same bits.
  Tensor w2 = w.detach().requires_grad_(), b2 = b.detach();
  gw::linear(x, w2, b2).backward(dy);
  CHECK(gw::equal(w2.grad(), w.grad()));
  Tensor b3 = b.detach().requires_grad_();
  gw::linear(x, w.detach(), b3).backward(dy);
  CHECK(gw::equal(b3.grad(), b.grad()));
  // A dY the GEMM does not take (column-major: the gradient of y.t()) is summed as before, k
  // in order in double: its first column, 1e20, 1, -1e20, 1, sums to 1 (four running sums: 0).
  Tensor dyt = gw::zeros({16, 8});
  for (int64_t r = 0; r < 4; ++r)
    dyt.narrow(1, r, 1).narrow(0, 0, 1).fill_(
        std::array{1e20, 1.0, -1e20, 1.0}[static_cast<size_t>(r)]);
  Tensor b4 = gw::zeros({16}).requires_grad_();
  gw::linear(gw::randn({8, 30}, gen), gw::randn({16, 30}, gen).requires_grad_(), b4)
      .t()
      .backward(dyt);
  CHECK(b4.grad().to_vector<float>()[0] == 1.0f);
  CHECK(gw::equal(b4.grad(), gw::sum(dyt.t(), {0})));
}

TEST_CASE("gradcheck: addmm with a bias row, a column and a full input",
          "[autograd][gradcheck][linalg]") {
  auto f = [](const std::vector<Tensor>& in) { return gw::addmm(in[0], in[1], in[2]); };
  expect_gradcheck("addmm (4) + (3,2)@(2,4)", f,
                   {uniform({4}, 160), uniform({3, 2}, 161), uniform({2, 4}, 162)});
  expect_gradcheck("addmm (3,1) + (3,2)@(2,4)", f,
                   {uniform({3, 1}, 163), uniform({3, 2}, 164), uniform({2, 4}, 165)});
  expect_gradcheck("addmm (3,4) + (3,2)ᵀ-view@(2,4)",
                   [](const std::vector<Tensor>& in) { return gw::addmm(in[0], in[1].t(), in[2]); },
                   {uniform({3, 4}, 166), uniform({2, 3}, 167), uniform({2, 4}, 168)});
}

TEST_CASE("gradcheck: addmm with a 0-dim and a (1,m) input; linear without input features",
          "[autograd][gradcheck][linalg]") {
  auto f = [](const std::vector<Tensor>& in) { return gw::addmm(in[0], in[1], in[2]); };
  expect_gradcheck("addmm () + (3,2)@(2,4)", f,
                   {uniform({}, 170), uniform({3, 2}, 171), uniform({2, 4}, 172)});
  expect_gradcheck("addmm (1,4) + (3,2)@(2,4)", f,
                   {uniform({1, 4}, 173), uniform({3, 2}, 174), uniform({2, 4}, 175)});
  // in_features 0: the bias, broadcast over the rows.
  Tensor b = make({1, 2, 3}, {3});
  Tensor y = gw::linear(gw::zeros({2, 0}, gw::kFloat64), gw::zeros({3, 0}, gw::kFloat64), b);
  CHECK(vec(y) == std::vector<double>{1, 2, 3, 1, 2, 3});
}
