// float16 and bfloat16 arithmetic on the CPU (core/cpu/half_as_float.h): an op computes on
// float32 copies of its 16-bit operands and rounds what it writes once. The reference is the same
// op on the same numbers in float32, rounded after: equal bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"

using gw::Tensor;

namespace {

// Numbers exact in both 16-bit formats (multiples of 1/16 below 8), so that the float32
// reference starts from the very values the 16-bit tensor holds.
Tensor values(gw::Shape shape, int seed) {
  std::vector<float> v(static_cast<size_t>(gw::numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((static_cast<int>(i) * 37 + seed * 11) % 113 - 56) / 16.f;
  return gw::from_vector(v, shape);
}

std::vector<float> read(const Tensor& t) { return t.to(gw::kFloat32).to_vector<float>(); }

// op on 16-bit operands == op on their float32 values, rounded to the 16-bit type.
void check_rounded_once(const std::string& name, gw::DType dtype,
                        const std::function<Tensor(const std::vector<Tensor>&)>& op,
                        const std::vector<Tensor>& f32) {
  INFO(name << " in " << gw::dtype_name(dtype));
  std::vector<Tensor> half;
  for (const Tensor& t : f32) half.push_back(t.is_floating_point() ? t.to(dtype) : t);
  const Tensor got = op(half), want = op(f32);
  CHECK(got.dtype() == (want.is_floating_point() ? dtype : want.dtype()));
  CHECK(read(got) == read(want.is_floating_point() ? want.to(dtype) : want));
}

}  // namespace

TEST_CASE("float16 and bfloat16 compute on the CPU in float32, rounded once", "[core][half]") {
  using V = std::vector<Tensor>;
  const Tensor a = values({6, 16}, 1), b = values({6, 16}, 2), w = values({16, 24}, 3);
  const Tensor bias = values({24}, 4), idx = gw::from_vector(std::vector<int64_t>{5, 0, 3}, {3});
  for (gw::DType dtype : {gw::kBFloat16, gw::kFloat16}) {
    check_rounded_once("add", dtype, [](const V& t) { return t[0] + t[1]; }, {a, b});
    check_rounded_once("mul by a scalar", dtype, [](const V& t) { return t[0] * 3; }, {a});
    check_rounded_once("div", dtype, [](const V& t) { return t[0] / (t[1].abs() + 1); }, {a, b});
    check_rounded_once("gelu", dtype, [](const V& t) { return gw::gelu(t[0]); }, {a});
    check_rounded_once("tanh", dtype, [](const V& t) { return gw::tanh(t[0]); }, {a});
    check_rounded_once("clamp", dtype, [](const V& t) { return gw::clamp(t[0], -1.0, 2.0); }, {a});
    check_rounded_once("where", dtype,
                       [](const V& t) { return gw::where(gw::gt(t[0], t[1]), t[0], t[1]); },
                       {a, b});
    check_rounded_once("sum over a dim", dtype, [](const V& t) { return gw::sum(t[0], {1}); }, {a});
    check_rounded_once("max along a dim", dtype, [](const V& t) { return gw::max(t[0], 0).values; },
                       {a});
    check_rounded_once("argmax along a dim", dtype,
                       [](const V& t) { return gw::max(t[0], 1).indices; }, {a});
    check_rounded_once("softmax", dtype, [](const V& t) { return gw::softmax(t[0], 1); }, {a});
    check_rounded_once("log_softmax", dtype, [](const V& t) { return gw::log_softmax(t[0], 0); },
                       {a});
    check_rounded_once("matmul", dtype, [](const V& t) { return gw::matmul(t[0], t[1]); }, {a, w});
    check_rounded_once("matmul, transposed operand", dtype,
                       [](const V& t) { return gw::matmul(t[0], t[1].t()); }, {a, b});
    check_rounded_once("addmm", dtype, [](const V& t) { return gw::addmm(t[2], t[0], t[1]); },
                       {a, w, bias});
    check_rounded_once("bmm", dtype,
                       [](const V& t) {
                         return gw::bmm(t[0].view({2, 3, 16}), t[1].view({2, 16, 12}));
                       },
                       {a, w});
    check_rounded_once("index_select", dtype,
                       [](const V& t) { return gw::index_select(t[0], 0, t[1]); }, {a, idx});
    check_rounded_once("gather", dtype,
                       [](const V& t) {
                         return gw::gather(t[0], 1, gw::zeros({6, 3}, gw::kInt64) + 2);
                       },
                       {a});
    check_rounded_once("add with alpha", dtype, [](const V& t) { return gw::add(t[0], t[1], 2.5); },
                       {a, b});
    check_rounded_once("a broadcast operand", dtype,
                       [](const V& t) { return t[0] * t[1].narrow(0, 0, 1); }, {a, b});
    CHECK(read(gw::arange(0, 10, 0.3, dtype)) ==
          read(gw::arange(0, 10, 0.3, gw::kFloat32).to(dtype)));
    check_rounded_once("fold", dtype,
                       [](const V& t) {
                         return gw::fold(t[0].view({1, 4, 24}), {5, 7}, {2, 2});
                       },
                       {values({4, 24}, 6)});
    check_rounded_once("scatter_add, which reads its output", dtype,
                       [](const V& t) {
                         Tensor index = gw::zeros({2, 16}, gw::kInt64);
                         return gw::scatter_add(t[0], 0, index, t[1].narrow(0, 0, 2));
                       },
                       {a, b});
    check_rounded_once("add_ in place", dtype,
                       [](const V& t) {
                         Tensor x = t[0].clone();
                         x.add_(t[1]);
                         return x;
                       },
                       {a, b});
    check_rounded_once("conv2d", dtype,
                       [](const V& t) {
                         return gw::conv2d(t[0].view({1, 6, 4, 4}), t[1].view({4, 6, 2, 2}));
                       },
                       {a, values({4, 6, 2, 2}, 5)});
  }
}

TEST_CASE("16-bit random numbers on the CPU are float32 draws rounded", "[core][half]") {
  for (gw::DType dtype : {gw::kBFloat16, gw::kFloat16}) {
    INFO(gw::dtype_name(dtype));
    gw::Generator g16(7), g32(7);
    const Tensor h = gw::randn({64}, g16, dtype);
    CHECK(h.dtype() == dtype);
    CHECK(read(h) == read(gw::randn({64}, g32, gw::kFloat32).to(dtype)));
    // U[0, 1): a draw that rounds up to 1 becomes 0, as on a GPU (about 1 in 500 in bfloat16).
    const std::vector<float> u = read(gw::rand({20000}, g16, dtype));
    const std::vector<float> f = read(gw::rand({20000}, g32, gw::kFloat32).to(dtype));
    int mapped = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      CHECK((u[i] >= 0.f && u[i] < 1.f));
      if (f[i] == 1.f) {
        CHECK(u[i] == 0.f);
        ++mapped;
      } else {
        CHECK(u[i] == f[i]);
      }
    }
    if (dtype == gw::kBFloat16) CHECK(mapped > 0);  // the case above did happen
  }
  CHECK_THROWS_WITH(gw::randint(0, 1000, {4}, gw::kBFloat16),
                    Catch::Contains("[randint]") && Catch::Contains("256"));
  const Tensor ints = gw::randint(-256, 257, {1000}, gw::kBFloat16);
  CHECK(ints.dtype() == gw::kBFloat16);
  for (float v : read(ints)) CHECK((v == std::floor(v) && v >= -256 && v <= 256));
  // [a, b) away from 0, and below it: a draw that rounds up to b becomes a.
  for (auto [lo, hi] : {std::pair{1.0, 2.0}, std::pair{-2.0, -1.0}}) {
    INFO("uniform_ on [" << lo << ", " << hi << ")");
    Tensor u = gw::empty({20000}, gw::kBFloat16);
    gw::Generator g(3);
    gw::uniform_(u, lo, hi, g);
    for (float v : read(u)) CHECK((v >= lo && v < hi));  // a remap to 0 fails
  }
}

TEST_CASE("a number beside 16-bit floats stays float32, and mean and var sum in float32",
          "[core][half]") {
  // As PyTorch's kernels: bfloat16's nearest 257 is 256, and a bfloat16 sum of 257 values has
  // 8 bits; both would be rounded before the division, where PyTorch divides in float32.
  using V = std::vector<Tensor>;
  const Tensor x = values({6, 16}, 1), long_row = values({257}, 2);
  for (gw::DType dtype : {gw::kBFloat16, gw::kFloat16}) {
    check_rounded_once("divided by 257", dtype, [](const V& t) { return t[0] / 257; }, {x});
    check_rounded_once("times 0.1", dtype, [](const V& t) { return t[0] * 0.1; }, {x});
    check_rounded_once("0.3 minus", dtype, [](const V& t) { return 0.3 - t[0]; }, {x});
    check_rounded_once("257 over", dtype, [](const V& t) { return 257 / (t[0].abs() + 1); }, {x});
    check_rounded_once("div_ by 257 in place", dtype,
                       [](const V& t) {
                         Tensor y = t[0].clone();
                         y.div_(257);
                         return y;
                       },
                       {x});
    check_rounded_once("mean of 257", dtype, [](const V& t) { return gw::mean(t[0]); }, {long_row});
    check_rounded_once("var of 257", dtype, [](const V& t) { return gw::var(t[0], {0}, 1, false); },
                       {long_row});
  }
  const Tensor ones = gw::ones({257}, gw::TensorOptions(gw::kBFloat16));
  CHECK(gw::mean(ones).item<double>() == 1.0);
  // A number over a 0-dim 16-bit tensor is of its dtype, as every other number beside one.
  const Tensor three = gw::full({}, 3.0, gw::TensorOptions(gw::kBFloat16));
  for (const Tensor& r : {2 / three, 2 - three, 2 * three, three / 2})
    CHECK(r.dtype() == gw::kBFloat16);
  // Comparisons take the number rounded to the tensor's dtype, as PyTorch's do.
  const Tensor tenth = gw::full({1}, 0.1, gw::TensorOptions(gw::kBFloat16));
  CHECK(gw::eq(tenth, 0.1).item<bool>());
  CHECK(!gw::lt(gw::full({1}, 256.0, gw::TensorOptions(gw::kBFloat16)), 257).item<bool>());
}
