// gradwire's ops against PyTorch 1.13. tests/core/fixtures/make_reference.py stores inputs
// ("in.*") and PyTorch's results ("out.*"); each case below recomputes one result from the same
// inputs. Every "out.*" in the file must have a case here, so the script and this table stay in
// step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/ops.h"

using gw::Shape;
using gw::Tensor;

namespace {

const gw::NamedTensors& fixture() {
  static const gw::NamedTensors tensors =
      gw::load_safetensors(GW_SOURCE_DIR "/tests/core/fixtures/reference.safetensors");
  return tensors;
}

Tensor in(const std::string& name) { return fixture().at("in." + name); }

struct Case {
  std::string family;
  std::string key;  // the result is "out.<key>"
  std::function<Tensor()> compute;
};

// clang-format off
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
    {"arithmetic", "add_broadcast", [] { return in("a") + in("b"); }},
    {"arithmetic", "add_alpha", [] { return gw::add(in("a"), in("b"), 2); }},
    {"arithmetic", "sub_broadcast", [] { return in("a") - in("c"); }},
    {"arithmetic", "sub_alpha", [] { return gw::sub(in("a"), in("b"), 0.5); }},
    {"arithmetic", "mul_broadcast3", [] { return in("x3") * in("y2"); }},
    {"arithmetic", "div_broadcast", [] { return in("a") / in("pos"); }},
    {"arithmetic", "add_int_float", [] { return in("i") + in("b"); }},
    {"arithmetic", "mul_int_float", [] { return in("i") * in("b"); }},
    {"arithmetic", "mul_int_scalar", [] { return in("i") * 2; }},
    {"arithmetic", "mul_int_float_scalar", [] { return in("i") * 2.5; }},
    {"arithmetic", "div_int", [] { return in("i") / in("j"); }},
    {"arithmetic", "div_int_scalar", [] { return in("i") / 2; }},
    {"arithmetic", "add_i32_i64", [] { return in("i32") + in("j"); }},
    {"arithmetic", "add_i32_scalar", [] { return in("i32") + 2; }},
    {"arithmetic", "add_f64_f32", [] { return in("d") + in("b"); }},
    {"arithmetic", "add_0dim_f64", [] { return in("a") + in("s64"); }},
    {"arithmetic", "rsub_scalar", [] { return 1.5 - in("a"); }},

    {"pointwise", "pow_scalar", [] { return gw::pow(in("pos"), 2.5); }},
    {"pointwise", "pow_tensor", [] { return gw::pow(in("pos"), in("exps")); }},
    {"pointwise", "pow_int", [] { return gw::pow(in("i"), 2); }},
    {"pointwise", "exp", [] { return gw::exp(in("u") / 3); }},
    {"pointwise", "log", [] { return gw::log(in("pos")); }},
    {"pointwise", "sqrt", [] { return gw::sqrt(in("pos")); }},
    {"pointwise", "rsqrt", [] { return gw::rsqrt(in("pos")); }},
    {"pointwise", "sigmoid", [] { return gw::sigmoid(in("u")); }},
    {"pointwise", "tanh", [] { return gw::tanh(in("u")); }},
    {"pointwise", "relu", [] { return gw::relu(in("u")); }},
    {"pointwise", "gelu", [] { return gw::gelu(in("u")); }},
    {"pointwise", "gelu_tanh", [] { return gw::gelu(in("u"), "tanh"); }},
    {"pointwise", "clamp", [] { return gw::clamp(in("u"), -0.5, 0.5); }},
    {"pointwise", "clamp_min", [] { return gw::clamp(in("u"), 0.25, std::nullopt); }},
    {"pointwise", "clamp_int", [] { return gw::clamp(in("i"), -2, 3); }},
    {"pointwise", "where", [] { return gw::where(in("cond"), in("a"), in("b")); }},
    {"pointwise", "where_scalar", [] { return gw::where(in("cond"), in("a"), 0.0); }},
    {"pointwise", "masked_fill", [] { return gw::masked_fill(in("a"), in("mask"), -1.0); }},

    {"reduction", "sum_all", [] { return gw::sum(in("r")); }},
    {"reduction", "sum_dim", [] { return gw::sum(in("r"), {1}); }},
    {"reduction", "sum_dims_keepdim", [] { return gw::sum(in("r"), {0, 2}, true); }},
    {"reduction", "sum_int", [] { return gw::sum(in("ri"), {1}); }},
    {"reduction", "sum_bool", [] { return gw::sum(in("cond")); }},
    {"reduction", "mean_all", [] { return gw::mean(in("r")); }},
    {"reduction", "mean_dim", [] { return gw::mean(in("r"), {-1}); }},
    {"reduction", "mean_dims_keepdim", [] { return gw::mean(in("r"), {0, 1}, true); }},
    {"reduction", "max_all", [] { return gw::max(in("r")); }},
    {"reduction", "min_all", [] { return gw::min(in("r")); }},
    {"reduction", "max_dim.values", [] { return gw::max(in("r"), 1).values; }},
    {"reduction", "max_dim.indices", [] { return gw::max(in("r"), 1).indices; }},
    {"reduction", "min_dim_keepdim.values", [] { return gw::min(in("r"), -1, true).values; }},
    {"reduction", "min_dim_keepdim.indices", [] { return gw::min(in("r"), -1, true).indices; }},
    {"reduction", "max_int_dim.values", [] { return gw::max(in("ties"), 1).values; }},
    {"reduction", "max_int_dim.indices", [] { return gw::max(in("ties"), 1).indices; }},
    {"reduction", "amax", [] { return gw::amax(in("r"), {0, 2}); }},
    {"reduction", "argmax_all", [] { return gw::argmax(in("r")); }},
    {"reduction", "argmax_dim_keepdim", [] { return gw::argmax(in("r"), 2, true); }},
    {"reduction", "argmin_dim", [] { return gw::argmin(in("r"), 0); }},
    // Shape{...} and not {...}: a braced single int would pick the `correction` overload.
    {"reduction", "var_all", [] { return gw::var(in("r")); }},
    {"reduction", "var_dim", [] { return gw::var(in("r"), Shape{1}); }},
    {"reduction", "var_dims_biased_keepdim", [] { return gw::var(in("r"), Shape{0, 2}, 0, true); }},
    {"reduction", "std_all", [] { return gw::std(in("r")); }},
    {"reduction", "std_dim_keepdim", [] { return gw::std(in("r"), Shape{-1}, 1, true); }},
    {"reduction", "logsumexp_dim", [] { return gw::logsumexp(in("r"), {1}); }},
    {"reduction", "logsumexp_dims_keepdim",
     [] { return gw::logsumexp(in("r") * 10, {0, 2}, true); }},
    {"reduction", "softmax_last", [] { return gw::softmax(in("r"), -1); }},
    {"reduction", "softmax_first", [] { return gw::softmax(in("r"), 0); }},
    {"reduction", "log_softmax", [] { return gw::log_softmax(in("r") * 10, 1); }},

    {"matmul", "matmul_2d", [] { return gw::matmul(in("m1"), in("m2")); }},
    {"matmul", "matmul_batched_broadcast", [] { return gw::matmul(in("bm1"), in("bm2")); }},
    {"matmul", "matmul_transposed_lhs", [] { return gw::matmul(in("mt").t(), in("m2")); }},
    {"matmul", "matmul_transposed_rhs", [] { return gw::matmul(in("m1"), in("m2t").t()); }},
    {"matmul", "matmul_batched_transposed",
     [] { return gw::matmul(in("bm1"), in("bm3").transpose(-1, -2)); }},
    {"matmul", "matmul_mat_vec", [] { return gw::matmul(in("m1"), in("v4")); }},
    {"matmul", "matmul_vec_mat", [] { return gw::matmul(in("v3"), in("m1")); }},
    {"matmul", "matmul_dot", [] { return gw::matmul(in("v4"), in("v4")); }},

    {"indexing", "index_select", [] { return gw::index_select(in("m1"), 1, in("idx")); }},
    {"indexing", "index_select_dim0", [] { return gw::index_select(in("r"), 0, in("sel")); }},
    {"indexing", "gather", [] { return gw::gather(in("m1"), 1, in("gidx")); }},
    {"indexing", "scatter_add",
     [] { return gw::scatter_add(in("m1"), 1, in("gidx"), in("src")); }},

    {"creation", "cat_dim0",
     [] { return gw::cat({in("a"), in("e"), in("c").expand({2, 3})}, 0); }},
    {"creation", "cat_dim1", [] { return gw::cat({in("a"), in("c")}, 1); }},
    {"creation", "stack_dim0", [] { return gw::stack({in("a"), in("e")}, 0); }},
    {"creation", "stack_dim2", [] { return gw::stack({in("a"), in("e")}, 2); }},
    {"creation", "linspace", [] { return gw::linspace(0, 1, 5); }},
    {"creation", "linspace_neg", [] { return gw::linspace(-2, 3, 7); }},
    {"creation", "linspace_f64", [] { return gw::linspace(-1, 1, 4, gw::kFloat64); }},
    {"creation", "arange_int", [] { return gw::arange(10); }},
    {"creation", "arange_step", [] { return gw::arange(0, 10, 3); }},
    {"creation", "arange_float", [] { return gw::arange(1, 2.5, 0.5); }},
    {"creation", "arange_neg_float", [] { return gw::arange(-1.0, 1.0, 0.25); }},
  };
  return all;
}
// clang-format on

const std::vector<std::string> kFamilies = {"arithmetic", "pointwise", "reduction",
                                            "matmul",     "indexing",  "creation"};

bool matches(const Tensor& got, const Tensor& expected) {
  if (got.dtype() == gw::kFloat32) return gw::allclose(got, expected, 1e-5, 1e-6);
  if (got.dtype() == gw::kFloat64) return gw::allclose(got, expected, 1e-10, 1e-12);
  return gw::equal(got, expected);  // integers and bools: exact
}

void check_family(const std::string& family) {
  int checked = 0;
  for (const Case& c : cases()) {
    if (c.family != family) continue;
    ++checked;
    INFO("out." << c.key);
    const Tensor& expected = fixture().at("out." + c.key);
    Tensor got;
    try {
      got = c.compute();
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << e.what());
      continue;
    }
    INFO("expected " << expected << "\ngot " << got);
    CHECK(got.dtype() == expected.dtype());
    CHECK(got.sizes() == expected.sizes());
    if (got.dtype() == expected.dtype() && got.sizes() == expected.sizes()) {
      CHECK(matches(got, expected));
    }
  }
  CHECK(checked > 0);
}

}  // namespace

TEST_CASE("reference: arithmetic with broadcasting and promotion", "[core][reference]") {
  check_family("arithmetic");
}
TEST_CASE("reference: pointwise functions", "[core][reference]") { check_family("pointwise"); }
TEST_CASE("reference: reductions and softmax", "[core][reference]") { check_family("reduction"); }
TEST_CASE("reference: matmul", "[core][reference]") { check_family("matmul"); }
TEST_CASE("reference: indexing", "[core][reference]") { check_family("indexing"); }
TEST_CASE("reference: cat, stack and ranges", "[core][reference]") { check_family("creation"); }

TEST_CASE("reference: every PyTorch result has a gradwire case", "[core][reference]") {
  std::set<std::string> known;
  for (const Case& c : cases()) {
    INFO("case " << c.key);
    CHECK(known.insert("out." + c.key).second);  // no case twice
    CHECK(std::find(kFamilies.begin(), kFamilies.end(), c.family) != kFamilies.end());
    CHECK(fixture().count("out." + c.key) == 1);  // no case without a PyTorch result
  }
  for (const auto& [name, t] : fixture()) {
    if (name.rfind("out.", 0) != 0) continue;
    INFO(name << " is in reference.safetensors but no case in this file checks it");
    CHECK(known.count(name) == 1);
  }
}
