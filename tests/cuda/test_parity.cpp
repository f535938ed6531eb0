// CPU/CUDA parity: every Backend kernel reached through the public core ops, on the CPU and
// on CUDA copies of the same inputs, compared with per-dtype tolerances. float16/bfloat16 run
// on CUDA only; their reference is the CPU result in float32 on the same rounded inputs.
#include <catch2/catch.hpp>

#include <functional>
#include <limits>

#include "core/cuda/blas.h"
#include "core/ops.h"
#include "core/random.h"
#include "nn/functional.h"
#include "tests/cuda/cuda_test_util.h"

using cuda_test::expect_close;
using cuda_test::kGpu;
using cuda_test::Tolerance;
using gw::Tensor;
using Inputs = std::vector<Tensor>;
using Op = std::function<Tensor(const Inputs&)>;

namespace {

Tensor randn(gw::Shape shape, uint64_t seed) {
  gw::Generator gen(seed);
  return gw::randn(std::move(shape), gen);
}
Tensor positive(gw::Shape shape, uint64_t seed) {
  return gw::add(gw::abs(randn(shape, seed)), 0.25);
}

Inputs to_device(const Inputs& in, gw::Device d) {
  Inputs out;
  for (const Tensor& t : in) out.push_back(t.to(d));
  return out;
}

// op on CPU inputs vs op on their CUDA copies.
void parity(const std::string& what, const Inputs& inputs, const Op& op,
            std::optional<Tolerance> tol = std::nullopt) {
  Tensor expected = op(inputs);
  Tensor actual = op(to_device(inputs, kGpu));
  CHECK(actual.device() == kGpu);
  CHECK(actual.dtype() == expected.dtype());
  expect_close(expected, actual, what, tol);
}

// op in a 16-bit dtype on CUDA vs op in float32 on the CPU, both from the rounded inputs.
void parity_16(const std::string& what, gw::DType dtype, const Inputs& inputs, const Op& op) {
  Inputs rounded;
  for (const Tensor& t : inputs) rounded.push_back(t.is_floating_point() ? t.to(dtype) : t);
  Inputs cpu;
  for (const Tensor& t : rounded) cpu.push_back(t.is_floating_point() ? t.to(gw::kFloat32) : t);
  Tensor expected = op(cpu);
  Tensor actual = op(to_device(rounded, kGpu));
  CHECK(actual.dtype() == (expected.is_floating_point() ? dtype : expected.dtype()));
  expect_close(expected, actual, what + " (" + std::string(gw::dtype_name(dtype)) + ")");
}

struct Named {
  const char* name;
  Tensor (*fn)(const Tensor&);
  bool positive_only;
};

}  // namespace

TEST_CASE("unary ops match the CPU", "[cuda][parity][elementwise]") {
  GW_REQUIRE_CUDA_DEVICE();
  const std::vector<Named> ops = {
      {"neg", gw::neg, false},         {"abs", gw::abs, false},
      {"exp", gw::exp, false},         {"log", gw::log, true},
      {"log1p", gw::log1p, true},      {"expm1", gw::expm1, false},
      {"sqrt", gw::sqrt, true},        {"rsqrt", gw::rsqrt, true},
      {"square", gw::square, false},   {"reciprocal", gw::reciprocal, true},
      {"sin", gw::sin, false},         {"cos", gw::cos, false},
      {"erf", gw::erf, false},         {"sign", gw::sign, false},
      {"floor", gw::floor, false},     {"ceil", gw::ceil, false},
      {"round", gw::round, false},     {"relu", gw::relu, false},
      {"sigmoid", gw::sigmoid, false}, {"tanh", gw::tanh, false},
      {"silu", gw::silu, false},
  };
  for (const Named& u : ops) {
    Tensor x = gw::mul(u.positive_only ? positive({6, 33}, 1) : randn({6, 33}, 1), 3);
    auto op = [&u](const Inputs& in) { return u.fn(in[0]); };
    auto strided = [&u](const Inputs& in) { return u.fn(in[0].t()); };  // a transposed view
    parity(u.name, {x}, op);
    parity(std::string(u.name) + " float64", {x.to(gw::kFloat64)}, op);
    parity(std::string(u.name) + " strided", {x}, strided);
    parity_16(u.name, gw::kFloat16, {x}, op);
    parity_16(u.name, gw::kBFloat16, {x}, op);
  }
  Tensor x = gw::mul(randn({5, 9}, 2), 4);
  parity("gelu", {x}, [](const Inputs& in) { return gw::gelu(in[0]); });
  parity("gelu tanh", {x}, [](const Inputs& in) { return gw::gelu(in[0], "tanh"); });
  Tensor i = x.to(gw::kInt64);
  for (auto fn : {gw::neg, gw::abs, gw::square, gw::sign, gw::relu, gw::floor, gw::round}) {
    parity("int64 unary", {i}, [fn](const Inputs& in) { return fn(in[0]); });
    parity("int32 unary", {i.to(gw::kInt32)}, [fn](const Inputs& in) { return fn(in[0]); });
  }
  parity("exp of ints is float", {i}, [](const Inputs& in) { return gw::exp(gw::div(in[0], 4)); });
  Tensor b = gw::gt(x, 0);
  parity("logical_not", {b}, [](const Inputs& in) { return gw::logical_not(in[0]); });
  parity("abs of bool", {b}, [](const Inputs& in) { return gw::abs(in[0]); });
  CHECK_THROWS_AS(gw::neg(b.to(kGpu)), gw::DTypeError);
}

TEST_CASE("binary ops, broadcasting and promotion match the CPU", "[cuda][parity][elementwise]") {
  GW_REQUIRE_CUDA_DEVICE();
  using F = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<const char*, F>> ops = {
      {"maximum", gw::maximum}, {"minimum", gw::minimum},
      {"logical_and", gw::logical_and}, {"logical_or", gw::logical_or},
  };
  Tensor a = gw::mul(randn({4, 1, 5}, 3), 3), b = gw::mul(randn({3, 5}, 4), 3);
  auto check_all = [&](const std::string& tag, const Tensor& x, const Tensor& y) {
    parity(tag + " add", {x, y}, [](const Inputs& in) { return gw::add(in[0], in[1]); });
    parity(tag + " sub", {x, y}, [](const Inputs& in) { return gw::sub(in[0], in[1]); });
    parity(tag + " mul", {x, y}, [](const Inputs& in) { return gw::mul(in[0], in[1]); });
    parity(tag + " eq", {x, y}, [](const Inputs& in) { return gw::eq(in[0], in[1]); });
    parity(tag + " ne", {x, y}, [](const Inputs& in) { return gw::ne(in[0], in[1]); });
    parity(tag + " lt", {x, y}, [](const Inputs& in) { return gw::lt(in[0], in[1]); });
    parity(tag + " le", {x, y}, [](const Inputs& in) { return gw::le(in[0], in[1]); });
    parity(tag + " gt", {x, y}, [](const Inputs& in) { return gw::gt(in[0], in[1]); });
    parity(tag + " ge", {x, y}, [](const Inputs& in) { return gw::ge(in[0], in[1]); });
    for (const auto& [name, fn] : ops) {
      parity(tag + " " + name, {x, y}, [fn](const Inputs& in) { return fn(in[0], in[1]); });
    }
  };
  check_all("float32", a, b);
  check_all("float64", a.to(gw::kFloat64), b.to(gw::kFloat64));
  check_all("int64", a.to(gw::kInt64), b.to(gw::kInt64));
  check_all("int32", a.to(gw::kInt32), b.to(gw::kInt32));
  check_all("mixed", a.to(gw::kInt32), b);
  parity("div", {a, b}, [](const Inputs& in) { return gw::div(in[0], in[1]); });
  parity("int div", {a.to(gw::kInt64), gw::add(b.to(gw::kInt64), 100)},
         [](const Inputs& in) { return gw::div(in[0], in[1]); });
  parity("pow", {gw::abs(a), b}, [](const Inputs& in) { return gw::pow(in[0], in[1]); });
  parity("int pow", {a.to(gw::kInt64), gw::abs(b).to(gw::kInt64)},
         [](const Inputs& in) { return gw::pow(in[0], in[1]); });
  CHECK_THROWS_AS(gw::pow(a.to(gw::kInt64).to(kGpu), gw::full({1}, -1, gw::kInt64).to(kGpu)),
                  gw::InvalidArgumentError);
  parity("bool add/mul", {gw::gt(a, 0), gw::gt(b, 0)},
         [](const Inputs& in) { return gw::add(in[0], gw::mul(in[0], in[1])); });
  parity("scalars", {a}, [](const Inputs& in) {
    return gw::sub(2.5, gw::div(gw::add(gw::mul(in[0], 3), 1), 2));
  });
  // CPU scalar tensors beside CUDA tensors, as PyTorch allows: in-place with alpha, and one
  // that wants a gradient, which comes back on the CPU.
  parity("CPU scalar tensors", {a}, [](const Inputs& in) {
    Tensor t = in[0].clone();
    t.add_(gw::scalar_tensor(1.5), 2.0);
    return gw::add(gw::mul(t, gw::scalar_tensor(3.0)), gw::scalar_tensor(-1.0), 0.5);
  });
  Tensor w = gw::scalar_tensor(2.0).requires_grad_(true);
  gw::sum(gw::mul(w, a.to(kGpu))).backward();
  CHECK(w.grad().device() == gw::kCPU);
  CHECK(w.grad().item<double>() == Approx(gw::sum(a).item<double>()).epsilon(1e-5));
  parity("add alpha", {a, b}, [](const Inputs& in) { return gw::add(in[0], in[1], 0.5); });
  parity("sub alpha int", {a.to(gw::kInt64), b.to(gw::kInt64)},
         [](const Inputs& in) { return gw::sub(in[0], in[1], 3); });
  parity("in-place add_ alpha", {randn({3, 5}, 5), b}, [](const Inputs& in) {
    Tensor t = in[0].clone();
    t.add_(in[1], -0.1);
    return t;
  });
  parity("in-place mul_ on a view", {randn({5, 3}, 6), b}, [](const Inputs& in) {
    Tensor t = in[0].clone();
    Tensor v = t.t();
    v.mul_(in[1]);
    return t;
  });
  Tensor nan = gw::full({3, 5}, std::numeric_limits<double>::quiet_NaN());
  parity("maximum with NaN", {nan.narrow(0, 0, 1), b},
         [](const Inputs& in) { return gw::maximum(in[0], in[1]); });
  for (gw::DType t : {gw::kFloat16, gw::kBFloat16}) {
    parity_16("add", t, {a, b}, [](const Inputs& in) { return gw::add(in[0], in[1]); });
    parity_16("mul", t, {a, b}, [](const Inputs& in) { return gw::mul(in[0], in[1]); });
    parity_16("div", t, {a, b}, [](const Inputs& in) { return gw::div(in[0], in[1]); });
    parity_16("lt", t, {a, b}, [](const Inputs& in) { return gw::lt(in[0], in[1]); });
    parity_16("add alpha", t, {a, b}, [](const Inputs& in) { return gw::add(in[0], in[1], 2); });
    // A number beside 16-bit floats is float32 on both devices (bfloat16's 257 would be 256):
    // the same float32 arithmetic, rounded once, bit for bit.
    const Tensor h = a.to(t);
    for (const auto& [name, op] : std::vector<std::pair<const char*, Op>>{
             {"divided by 257", [](const Inputs& in) { return in[0] / 257; }},
             {"257 minus", [](const Inputs& in) { return 257 - in[0]; }},
             {"times 0.1 in place", [](const Inputs& in) { return in[0].clone().mul_(0.1); }}}) {
      INFO(name << " in " << gw::dtype_name(t));
      CHECK(gw::equal(op({h.to(kGpu)}).to(gw::kCPU), op({h})));
    }
  }
}

TEST_CASE("where and clamp match the CPU", "[cuda][parity][elementwise]") {
  GW_REQUIRE_CUDA_DEVICE();
  Tensor a = randn({4, 6}, 7), b = randn({6}, 8);
  Tensor cond = gw::gt(randn({4, 1}, 9), 0);
  parity("where", {cond, a, b}, [](const Inputs& in) { return gw::where(in[0], in[1], in[2]); });
  parity("where int", {cond, a.to(gw::kInt64), b.to(gw::kInt64)},
         [](const Inputs& in) { return gw::where(in[0], in[1], in[2]); });
  parity("where scalar", {cond, a}, [](const Inputs& in) { return gw::where(in[0], 1.5, in[1]); });
  parity_16("where", gw::kFloat16, {cond, a, b},
            [](const Inputs& in) { return gw::where(in[0], in[1], in[2]); });
  parity("masked_fill_", {a, cond}, [](const Inputs& in) {
    Tensor t = in[0].clone();
    t.masked_fill_(in[1].expand(t.sizes()), -7);
    return t;
  });
  parity("clamp", {a}, [](const Inputs& in) { return gw::clamp(in[0], -0.5, 0.5); });
  parity("clamp min", {a}, [](const Inputs& in) { return gw::clamp(in[0], 0, std::nullopt); });
  parity("clamp max", {a}, [](const Inputs& in) { return gw::clamp(in[0], std::nullopt, 0.1); });
  parity("clamp int", {gw::mul(a, 5).to(gw::kInt64)},
         [](const Inputs& in) { return gw::clamp(in[0], -2, 3); });
  parity("clamp promotes", {gw::mul(a, 5).to(gw::kInt64)},
         [](const Inputs& in) { return gw::clamp(in[0], -2.5, 3); });
  parity("clamp min > max", {a}, [](const Inputs& in) { return gw::clamp(in[0], 1, -1); });
  parity_16("clamp", gw::kBFloat16, {a}, [](const Inputs& in) { return gw::clamp(in[0], -1, 1); });
}

TEST_CASE("reductions match the CPU", "[cuda][parity][reduce]") {
  GW_REQUIRE_CUDA_DEVICE();
  Tensor x = randn({3, 4, 50}, 10);
  const std::vector<std::pair<std::string, Op>> ops = {
      {"sum", [](const Inputs& in) { return gw::sum(in[0]); }},
      {"sum 0", [](const Inputs& in) { return gw::sum(in[0], {0}); }},
      {"sum -1", [](const Inputs& in) { return gw::sum(in[0], {-1}); }},
      {"sum 0,2 keepdim", [](const Inputs& in) { return gw::sum(in[0], {0, 2}, true); }},
      {"prod 1", [](const Inputs& in) { return gw::prod(in[0], {1}); }},
      {"mean 2", [](const Inputs& in) { return gw::mean(in[0], {2}); }},
      {"max", [](const Inputs& in) { return gw::max(in[0]); }},
      {"min", [](const Inputs& in) { return gw::min(in[0]); }},
      {"amax 1", [](const Inputs& in) { return gw::amax(in[0], {1}); }},
      {"amin 0,1", [](const Inputs& in) { return gw::amin(in[0], {0, 1}); }},
      {"max dim values", [](const Inputs& in) { return gw::max(in[0], 2).values; }},
      {"max dim indices", [](const Inputs& in) { return gw::max(in[0], 2).indices; }},
      {"min dim 0 indices", [](const Inputs& in) { return gw::min(in[0], 0, true).indices; }},
      {"argmax", [](const Inputs& in) { return gw::argmax(in[0]); }},
      {"argmin 1", [](const Inputs& in) { return gw::argmin(in[0], 1); }},
      {"var", [](const Inputs& in) { return gw::var(in[0], {2}, 1, false); }},
      {"logsumexp", [](const Inputs& in) { return gw::logsumexp(in[0], {1}, false); }},
  };
  for (const auto& [name, op] : ops) {
    parity(name, {x}, op);
    parity(name + " float64", {x.to(gw::kFloat64)}, op);
    parity(name + " permuted", {x.permute({2, 0, 1}).contiguous().permute({1, 2, 0})}, op);
    if (name.find("var") == std::string::npos && name.find("mean") == std::string::npos &&
        name.find("logsumexp") == std::string::npos) {
      parity(name + " int64", {gw::mul(x, 4).to(gw::kInt64)}, op);
      parity(name + " int32", {gw::mul(x, 4).to(gw::kInt32)}, op);
    }
    if (name.find("prod") == std::string::npos) parity_16(name, gw::kFloat16, {x}, op);
  }
  Tensor big = randn({1 << 20}, 11);
  parity("sum of 2^20", {big}, [](const Inputs& in) { return gw::sum(in[0]); });
  parity("max of 2^20", {big}, [](const Inputs& in) { return gw::max(in[0]); });
  parity("argmax of 2^20", {big}, [](const Inputs& in) { return gw::argmax(in[0]); });
  parity("column sums", {big.view({1024, 1024})},
         [](const Inputs& in) { return gw::sum(in[0], {0}); });
  // Reductions split over many blocks, in every accumulator and output type: int32 sums into
  // int64, 16-bit maxima through float partials, bools in 16-element packs, and a NaN in a
  // later chunk than the largest number.
  Tensor ints = gw::mul(big, 100).to(gw::kInt32);
  parity("int32 sum of 2^20", {ints}, [](const Inputs& in) { return gw::sum(in[0]); });
  parity("int32 column sums", {ints.view({1024, 1024})},
         [](const Inputs& in) { return gw::sum(in[0], {0}); });
  parity_16("max of 2^20", gw::kBFloat16, {big},
            [](const Inputs& in) { return gw::amax(in[0], {0}); });
  parity_16("sum of 2^20", gw::kFloat16, {big}, [](const Inputs& in) { return gw::sum(in[0]); });
  Tensor flags = gw::gt(big, 3.0);
  parity("bool sum and max of 2^20", {flags}, [](const Inputs& in) {
    return gw::add(gw::sum(in[0]), gw::amax(in[0], {0}).to(gw::kInt64));
  });
  Tensor late_nan = big.clone();
  late_nan.narrow(0, 900000, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  parity("max of 2^20 with a late NaN", {late_nan},
         [](const Inputs& in) { return gw::amax(in[0], {0}); });
  parity("bool sum and max", {gw::gt(x, 0)},
         [](const Inputs& in) { return gw::add(gw::sum(in[0], {1}), gw::amax(in[0], {1})); });
  parity("sum of empty", {gw::zeros({3, 0})}, [](const Inputs& in) { return gw::sum(in[0], {1}); });
  Tensor with_nan = x.clone();
  with_nan.narrow(2, 7, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  parity("max with NaN", {with_nan}, [](const Inputs& in) { return gw::amax(in[0], {2}); });
  parity("argmax with NaN", {with_nan}, [](const Inputs& in) { return gw::argmax(in[0], 2); });
  Tensor ties = gw::zeros({4, 9});
  parity("argmax of ties is the first", {ties},
         [](const Inputs& in) { return gw::argmax(in[0], 1); });
}

TEST_CASE("matmul matches the CPU", "[cuda][parity][linalg]") {
  GW_REQUIRE_CUDA_DEVICE();
  const Tolerance f32{1e-5, 1e-5};
  Tensor a = randn({7, 5}, 12), b = randn({5, 3}, 13);
  auto mm = [](const Inputs& in) { return gw::matmul(in[0], in[1]); };
  parity("mm", {a, b}, mm, f32);
  parity("mm float64", {a.to(gw::kFloat64), b.to(gw::kFloat64)}, mm);
  parity("a^T b", {a.t().contiguous(), b},
         [](const Inputs& in) { return gw::matmul(in[0].t(), in[1]); }, f32);
  parity("a b^T", {a, b.t().contiguous()},
         [](const Inputs& in) { return gw::matmul(in[0], in[1].t()); }, f32);
  parity("sliced operands", {randn({9, 12}, 14), randn({12, 8}, 15)}, [](const Inputs& in) {
    return gw::matmul(in[0].slice(1, 0, 12, 2), in[1].slice(0, 0, 12, 2).slice(1, 1, 8));
  }, f32);
  parity("batched", {randn({4, 7, 5}, 16), randn({4, 5, 3}, 17)}, mm, f32);
  parity("broadcast batch", {randn({2, 1, 7, 5}, 18), randn({3, 5, 3}, 19)}, mm, f32);
  parity("batch times matrix", {randn({2, 3, 7, 5}, 20), b}, mm, f32);
  parity("vector @ matrix", {randn({5}, 21), b}, mm, f32);
  parity("matrix @ vector", {a, randn({5}, 22)}, mm, f32);
  parity("dot", {randn({64}, 23), randn({64}, 24)}, mm, f32);
  parity("k = 0", {gw::zeros({3, 0}), gw::zeros({0, 4})}, mm);
  parity("int64", {gw::mul(a, 5).to(gw::kInt64), gw::mul(b, 5).to(gw::kInt64)}, mm);
  parity("int32 batched transposed", {gw::mul(randn({3, 5, 7}, 25), 5).to(gw::kInt32),
                                      gw::mul(randn({3, 5, 4}, 26), 5).to(gw::kInt32)},
         [](const Inputs& in) { return gw::matmul(in[0].transpose(1, 2), in[1]); });
  parity("linear", {randn({6, 5}, 27), randn({4, 5}, 28), randn({4}, 29)},
         [](const Inputs& in) { return gw::linear(in[0], in[1], in[2]); }, f32);
  for (gw::DType t : {gw::kFloat16, gw::kBFloat16}) {
    parity_16("mm", t, {randn({16, 32}, 30), randn({32, 8}, 31)}, mm);
    parity_16("bmm transposed", t, {randn({3, 32, 16}, 32), randn({3, 32, 8}, 33)},
              [](const Inputs& in) { return gw::matmul(in[0].transpose(1, 2), in[1]); });
  }
  gw::cuda::set_allow_tf32(true);
  parity("mm with TF32", {randn({64, 64}, 34), randn({64, 64}, 35)}, mm, Tolerance{1e-2, 5e-2});
  gw::cuda::set_allow_tf32(false);
}

TEST_CASE("softmax matches the CPU", "[cuda][parity][reduce]") {
  GW_REQUIRE_CUDA_DEVICE();
  Tensor x = gw::mul(randn({3, 4, 37}, 40), 5);
  for (int64_t dim : {0, 1, 2}) {
    for (bool log : {false, true}) {
      Op op = [dim, log](const Inputs& in) {
        return log ? gw::log_softmax(in[0], dim) : gw::softmax(in[0], dim);
      };
      const std::string name = std::string(log ? "log_softmax" : "softmax") + " dim " +
                               std::to_string(dim);
      parity(name, {x}, op);
      parity(name + " float64", {x.to(gw::kFloat64)}, op);
      parity(name + " strided", {x.transpose(0, 2).contiguous().transpose(0, 2)}, op);
      parity_16(name, gw::kFloat16, {x}, op);
      parity_16(name, gw::kBFloat16, {x}, op);
    }
  }
  Tensor rows = randn({2, 1000}, 41);
  rows.narrow(0, 1, 1).fill_(-std::numeric_limits<double>::infinity());
  parity("softmax with a -inf row", {rows}, [](const Inputs& in) { return gw::softmax(in[0], 1); });
  parity("log_softmax wide", {randn({3, 5000}, 42)},
         [](const Inputs& in) { return gw::log_softmax(in[0], -1); });
  // Rows too long for registers (12288: just too long for shared memory as well; 16384 and
  // 20001: read twice), and rows that are not whole 16-byte packs.
  for (int64_t n : {12288, 16384, 20001, 1001, 1999}) {
    parity("softmax of rows of " + std::to_string(n), {gw::mul(randn({3, n}, 43), 4)},
           [](const Inputs& in) { return gw::softmax(in[0], -1); });
  }
  parity("log_softmax of an unaligned view", {randn({3, 4097}, 44)},
         [](const Inputs& in) { return gw::log_softmax(in[0].narrow(1, 1, 4096), -1); });
}

namespace {
// Gradients of sum(op(inputs) * weights) with respect to input `which`.
Tensor grad_of(const std::function<Tensor(const Inputs&)>& op, const Inputs& in, size_t which,
               const Tensor& weights) {
  Inputs leaves;
  for (const Tensor& t : in) {
    leaves.push_back(t.is_floating_point() ? t.detach().requires_grad_(true) : t);
  }
  gw::sum(gw::mul(op(leaves), weights)).backward();
  return leaves[which].grad();
}
}  // namespace

TEST_CASE("layer_norm and cross_entropy match the CPU, forward and backward",
          "[cuda][parity][nn]") {
  GW_REQUIRE_CUDA_DEVICE();
  namespace F = gw::nn::functional;
  // 37: one element per load; 768 and 4100: 16-byte packs held in registers; 10000: kept in
  // shared memory; 12288 and 16000: too long for either, read twice.
  for (int64_t n : {37, 768, 4100, 10000, 12288, 16000}) {
    const std::string tag = " n=" + std::to_string(n);
    Inputs in = {gw::add(gw::mul(randn({6, n}, 50), 3), 1), randn({n}, 51), randn({n}, 52)};
    auto norm = [n](const Inputs& t) { return F::layer_norm(t[0], {n}, t[1], t[2], 1e-5); };
    parity("layer_norm" + tag, in, norm);
    parity_16("layer_norm" + tag, gw::kBFloat16, in, norm);
    Tensor w = randn({6, n}, 53);
    for (size_t which : {0, 1, 2}) {
      parity("layer_norm grad " + std::to_string(which) + tag, {in[0], in[1], in[2], w},
             [&norm, which](const Inputs& t) {
               return grad_of(norm, {t[0], t[1], t[2]}, which, t[3]);
             });
    }
    parity("layer_norm without affine" + tag, {in[0], w}, [n](const Inputs& t) {
      return grad_of([n](const Inputs& u) { return F::layer_norm(u[0], {n}); }, {t[0]}, 0, t[1]);
    });
  }
  for (int64_t classes : {10, 1000, 32003}) {
    const std::string tag = " classes=" + std::to_string(classes);
    gw::Generator gen(54);
    Tensor logits = gw::mul(randn({7, classes}, 55), 4);
    Tensor target = gw::randint(0, classes, {7}, gen);
    auto loss = [](const Inputs& t) { return F::cross_entropy(t[0], t[1], F::Reduction::kNone); };
    parity("cross_entropy" + tag, {logits, target}, loss);
    parity_16("cross_entropy" + tag, gw::kBFloat16, {logits, target}, loss);
    parity("cross_entropy grad" + tag, {logits, target, randn({7}, 56)}, [&loss](const Inputs& t) {
      return grad_of(loss, {t[0], t[1]}, 0, t[2]);
    });
  }
  Tensor bad = gw::zeros({2, 3}, kGpu);
  CHECK_THROWS_WITH(F::cross_entropy(bad, gw::full({2}, 3, gw::kInt64).to(kGpu)),
                    Catch::Contains("target 3 is out of bounds for 3 classes"));
}

TEST_CASE("indexing matches the CPU", "[cuda][parity][index]") {
  GW_REQUIRE_CUDA_DEVICE();
  Tensor x = randn({5, 6, 7}, 50);
  Tensor idx = gw::from_vector(std::vector<int64_t>{4, 0, 2, 2});
  for (int64_t dim : {0, 1, 2}) {
    parity("index_select " + std::to_string(dim), {x, idx},
           [dim](const Inputs& in) { return gw::index_select(in[0], dim, in[1]); });
  }
  parity("index_select int32 index, int64 data", {gw::mul(x, 9).to(gw::kInt64), idx.to(gw::kInt32)},
         [](const Inputs& in) { return gw::index_select(in[0], 1, in[1]); });
  parity("embedding", {randn({10, 4}, 51), gw::from_vector(std::vector<int64_t>{1, 9, 3, 3, 0, 1},
                                                          {2, 3})},
         [](const Inputs& in) { return gw::embedding(in[0], in[1]); });
  gw::Generator gen(52);
  Tensor gidx = gw::randint(0, 6, {5, 3, 7}, gen);
  parity("gather", {x, gidx}, [](const Inputs& in) { return gw::gather(in[0], 1, in[1]); });
  parity("gather strided", {x, gidx}, [](const Inputs& in) {
    return gw::gather(in[0].transpose(0, 2), 1, in[1].transpose(0, 2));
  });
  parity("gather bool", {gw::gt(x, 0), gidx},
         [](const Inputs& in) { return gw::gather(in[0], 1, in[1]); });
  Tensor src = randn({5, 3, 7}, 53);
  parity("scatter_add", {x, gidx, src},
         [](const Inputs& in) { return gw::scatter_add(in[0], 1, in[1], in[2]); });
  parity("scatter_add int64", {gw::mul(x, 3).to(gw::kInt64), gidx, gw::mul(src, 3).to(gw::kInt64)},
         [](const Inputs& in) { return gw::scatter_add(in[0], 1, in[1], in[2]); });
  parity("scatter_add float64", {x.to(gw::kFloat64), gidx, src.to(gw::kFloat64)},
         [](const Inputs& in) { return gw::scatter_add(in[0], 1, in[1], in[2]); });
  parity_16("scatter_add", gw::kFloat16, {x, gidx, src},
            [](const Inputs& in) { return gw::scatter_add(in[0], 1, in[1], in[2]); });
  parity("one_hot", {gw::from_vector(std::vector<int64_t>{0, 3, 1})},
         [](const Inputs& in) { return gw::one_hot(in[0], 4); });
  // The embedding's gradient: whole rows added by a sort, not atomics, in the CPU's order, so
  // float32 sums equal the CPU's bit for bit (4096 tokens over 80 rows: ~50 per row), into a
  // self wider than the index and with a transposed src; the 16-bit types sum in float32.
  Tensor tokens = gw::randint(0, 80, {4096}, gen);
  Tensor grads = randn({64, 4096}, 54).t();
  for (gw::DType t : {gw::kFloat32, gw::kBFloat16}) {
    for (gw::DType index_type : {gw::kInt64, gw::kInt32}) {  // int32 widened, still broadcast
      INFO("embedding gradient rows in " << gw::dtype_name(t) << ", " << gw::dtype_name(index_type)
                                         << " index");
      const Tensor base = randn({80, 70}, 55).to(t);
      auto add_rows = [&](gw::Device d) {
        Tensor self = base.clone().to(d);  // to(kCPU) of a CPU tensor is the tensor itself
        const Tensor index = tokens.to(index_type).to(d).view({4096, 1}).expand({4096, 64});
        self.scatter_add_(0, index, grads.to(t).to(d));
        return self.to(gw::kCPU);
      };
      CHECK(gw::equal(add_rows(kGpu), add_rows(gw::kCPU)));
    }
  }
  Tensor bad_rows = gw::full({3, 1}, 80, gw::kInt64).to(kGpu).expand({3, 4});
  CHECK_THROWS_WITH(gw::zeros({80, 4}, kGpu).scatter_add_(0, bad_rows, gw::ones({3, 4}, kGpu)),
                    Catch::Contains("index 80 is out of range for dim 0 of size 80"));

  Tensor g = x.to(kGpu);
  Tensor bad = gw::from_vector(std::vector<int64_t>{1, 6}).to(kGpu);
  try {
    gw::index_select(g, 1, bad);
    FAIL("index_select with index 6 did not throw");
  } catch (const gw::IndexError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("[index_select] index 6 is out of range for "
                                                   "dim 1 of size 6"));
  }
  // With nothing to copy (an empty dim elsewhere) the indices are still checked, as on the CPU.
  CHECK_THROWS_AS(gw::index_select(gw::zeros({0, 6}, kGpu), 1, bad), gw::IndexError);
  CHECK_THROWS_AS(gw::index_select(gw::zeros({0, 6}), 1, bad.to(gw::kCPU)), gw::IndexError);
  CHECK_THROWS_AS(gw::gather(g, 1, gw::full({5, 1, 7}, -1, gw::kInt64).to(kGpu)),
                  gw::IndexError);
  CHECK_THROWS_AS(gw::scatter_add(g, 0, gw::full({1, 6, 7}, 5, gw::kInt64).to(kGpu), g),
                  gw::IndexError);
  // The device is still usable after a reported bad index.
  CHECK(gw::sum(g).item<double>() == Approx(gw::sum(x).item<double>()).epsilon(1e-6));
}

TEST_CASE("convolution helpers match the CPU", "[cuda][parity][conv]") {
  GW_REQUIRE_CUDA_DEVICE();
  const Tolerance f32{1e-5, 1e-5};
  Tensor x = randn({2, 3, 9, 8}, 60), w = randn({4, 3, 3, 2}, 61), bias = randn({4}, 62);
  for (const gw::Conv2dOptions& o : {gw::Conv2dOptions{}, gw::Conv2dOptions{{2, 1}, {1, 2}, {1, 1}},
                                     gw::Conv2dOptions{{1, 2}, {2, 0}, {2, 1}}}) {
    parity("conv2d", {x, w, bias},
           [&o](const Inputs& in) { return gw::conv2d(in[0], in[1], in[2], o); }, f32);
    parity("unfold", {x}, [&o](const Inputs& in) { return gw::unfold(in[0], {3, 2}, o); });
    Tensor cols = gw::unfold(x, {3, 2}, o);
    parity("fold", {cols}, [&o](const Inputs& in) { return gw::fold(in[0], {9, 8}, {3, 2}, o); });
    parity_16("conv2d", gw::kFloat16, {x, w, bias},
              [&o](const Inputs& in) { return gw::conv2d(in[0], in[1], in[2], o); });
  }
  parity("unfold of a strided input", {x}, [](const Inputs& in) {
    return gw::unfold(in[0].transpose(2, 3), {2, 2}, gw::Conv2dOptions{});
  });
  parity("max_pool2d", {x}, [](const Inputs& in) { return gw::max_pool2d(in[0], {2, 2}); });
  parity("max_pool2d padded", {x},
         [](const Inputs& in) { return gw::max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}); });
}

TEST_CASE("creation ops on CUDA match the CPU", "[cuda][parity][creation]") {
  GW_REQUIRE_CUDA_DEVICE();
  auto on = [](gw::DType t) { return gw::TensorOptions(t).with_device(kGpu); };
  for (gw::DType t : {gw::kFloat32, gw::kFloat64, gw::kInt64, gw::kInt32, gw::kBool,
                      gw::kFloat16, gw::kBFloat16}) {
    INFO(t);
    expect_close(gw::zeros({3, 4}, t), gw::zeros({3, 4}, on(t)), "zeros");
    expect_close(gw::ones({3, 4}, t), gw::ones({3, 4}, on(t)), "ones");
    expect_close(gw::full({5}, 3, t), gw::full({5}, 3, on(t)), "full");
    expect_close(gw::eye(4, 3, t), gw::eye(4, 3, on(t)), "eye");
  }
  for (gw::DType t : {gw::kFloat32, gw::kFloat64, gw::kInt64, gw::kInt32}) {
    expect_close(gw::arange(2, 40, 3, t), gw::arange(2, 40, 3, on(t)), "arange");
  }
  expect_close(gw::linspace(-1, 1, 11), gw::linspace(-1, 1, 11, on(gw::kFloat32)), "linspace");
  Tensor t = gw::zeros({4, 5}, on(gw::kFloat32));
  t.t().narrow(0, 1, 2).fill_(2.5);  // a strided fill
  Tensor ref = gw::zeros({4, 5});
  ref.t().narrow(0, 1, 2).fill_(2.5);
  expect_close(ref, t, "strided fill");
}

TEST_CASE("random ops on CUDA are reproducible and well distributed", "[cuda][random]") {
  GW_REQUIRE_CUDA_DEVICE();
  auto on = gw::TensorOptions(gw::kFloat32).with_device(kGpu);
  gw::Generator g1(5), g2(5);
  Tensor a = gw::randn({1 << 16}, g1, on), b = gw::randn({1 << 16}, g2, on);
  CHECK(gw::sum(gw::ne(a, b)).item<int64_t>() == 0);
  Tensor c = gw::randn({1 << 16}, g1, on);  // the generator moved on
  CHECK(gw::sum(gw::ne(a, c)).item<int64_t>() > 0);
  CHECK(gw::mean(a).item<double>() == Approx(0).margin(0.02));
  CHECK(gw::std(a, {}, 1, false).item<double>() == Approx(1).epsilon(0.02));

  Tensor u = gw::rand({1 << 16}, g1, on);
  CHECK(gw::min(u).item<double>() >= 0);
  CHECK(gw::max(u).item<double>() < 1);
  CHECK(gw::mean(u).item<double>() == Approx(0.5).margin(0.01));
  Tensor u64 = gw::empty({1000}, on.with_dtype(gw::kFloat64));
  gw::uniform_(u64, -2, 3, g1);
  CHECK(gw::min(u64).item<double>() >= -2);
  CHECK(gw::max(u64).item<double>() < 3);

  Tensor r = gw::randint(-3, 4, {10000}, g1, on.with_dtype(gw::kInt64));
  CHECK(gw::min(r).item<int64_t>() == -3);
  CHECK(gw::max(r).item<int64_t>() == 3);

  Tensor h = gw::randn({1000}, g1, on.with_dtype(gw::kFloat16));
  CHECK(h.dtype() == gw::kFloat16);
  CHECK(std::abs(gw::mean(h.to(gw::kFloat32)).item<double>()) < 0.15);

  Tensor bern = gw::empty({1 << 16}, on);
  gw::bernoulli_(bern, 0.25, g1);
  CHECK(gw::mean(bern).item<double>() == Approx(0.25).margin(0.01));
  Tensor p = gw::full({1 << 16}, 0.75, on);
  CHECK(gw::mean(gw::bernoulli(p, g1)).item<double>() == Approx(0.75).margin(0.01));
  Tensor bad = gw::full({8}, 0.5, on);
  bad.narrow(0, 5, 1).fill_(1.5);
  try {
    gw::bernoulli(bad, g1);
    FAIL("bernoulli with p = 1.5 did not throw");
  } catch (const gw::InvalidArgumentError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("probability 1.5 at index 5"));
  }
}
