// Bad input to core: every case throws the right gw::Error subclass, and the message names the
// operation and the offending values so a user can act on it.
#include <catch2/catch.hpp>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"

using gw::Shape;
using gw::Tensor;

namespace {

// Matches an exception whose what() contains every one of `parts` (Catch2 v2's Contains
// matches strings, so it is applied to the message here).
class Says : public Catch::MatcherBase<std::exception> {
 public:
  Says(std::initializer_list<std::string> parts) : parts_(parts) {}
  bool match(const std::exception& e) const override {
    const std::string message = e.what();
    for (const std::string& p : parts_) {
      if (!Catch::Matchers::Contains(p).match(message)) return false;
    }
    return true;
  }
  std::string describe() const override {
    std::string d = "has a message containing";
    for (const std::string& p : parts_) d += " \"" + p + "\"";
    return d;
  }

 private:
  std::vector<std::string> parts_;
};

Tensor m23() { return gw::zeros({2, 3}); }

}  // namespace

TEST_CASE("error classes carry their codes", "[core][errors]") {
  CHECK(gw::ShapeError("x").code() == gw::ErrorCode::kShape);
  CHECK(gw::IndexError("x").code() == gw::ErrorCode::kIndex);
  CHECK(gw::DTypeError("x").code() == gw::ErrorCode::kDType);
  CHECK(gw::InvalidArgumentError("x").code() == gw::ErrorCode::kInvalidArgument);
  CHECK(gw::StateError("x").code() == gw::ErrorCode::kState);
  CHECK(std::string(gw::error_code_name(gw::ErrorCode::kShape)) == "Shape");
  gw::RemoteError remote("worker1", "boom");
  CHECK(remote.worker() == "worker1");
  CHECK(std::string(remote.what()) == "[worker1] boom");
  // Every op error is catchable as gw::Error and as std::exception.
  CHECK_THROWS_AS(gw::mm(m23(), m23()), gw::Error);
  CHECK_THROWS_AS(gw::mm(m23(), m23()), std::runtime_error);
  try {
    gw::mm(m23(), m23());
  } catch (const gw::Error& e) {
    CHECK(e.code() == gw::ErrorCode::kShape);
  }
}

TEST_CASE("shapes that do not broadcast", "[core][errors]") {
  CHECK_THROWS_MATCHES(gw::add(m23(), gw::zeros({4})), gw::ShapeError,
                       Says({"[add]", "(2,3)", "(4)", "cannot be broadcast"}));
  CHECK_THROWS_MATCHES(m23() * gw::zeros({3, 3}), gw::ShapeError, Says({"[mul]", "(3,3)"}));
  CHECK_THROWS_MATCHES(gw::lt(m23(), gw::zeros({2})), gw::ShapeError, Says({"[lt]", "(2)"}));
  CHECK_THROWS_MATCHES(gw::where(gw::zeros({5}, gw::kBool), m23(), m23()), gw::ShapeError,
                       Says({"[where]", "(5)"}));
  CHECK_THROWS_MATCHES(m23().copy_(gw::zeros({4})), gw::ShapeError, Says({"[copy_]", "(4)"}));
  CHECK_THROWS_MATCHES(gw::zeros({3}).copy_(m23()), gw::ShapeError,
                       Says({"[copy_]", "(2,3)", "(3)"}));
  CHECK_THROWS_MATCHES(m23().masked_fill_(gw::zeros({2, 3, 1}, gw::kBool), 1), gw::ShapeError,
                       Says({"[masked_fill_]"}));
  CHECK_THROWS_MATCHES(gw::zeros({3}).add_(m23()), gw::ShapeError,
                       Says({"[add_]", "(3)", "(2,3)"}));
  CHECK_THROWS_MATCHES(gw::allclose(m23(), gw::zeros({2})), gw::ShapeError, Says({"[allclose]"}));
}

TEST_CASE("matrix products with mismatched shapes", "[core][errors]") {
  CHECK_THROWS_MATCHES(gw::mm(m23(), gw::zeros({4, 5})), gw::ShapeError,
                       Says({"[mm]", "(2,3)", "(4,5)", "cannot be multiplied"}));
  CHECK_THROWS_MATCHES(gw::matmul(m23(), gw::zeros({4, 5})), gw::ShapeError,
                       Says({"[matmul]", "(2,3)", "(4,5)"}));
  CHECK_THROWS_MATCHES(gw::matmul(gw::zeros({2, 3, 4}), gw::zeros({2, 5, 6})), gw::ShapeError,
                       Says({"[matmul]", "(2,3,4)", "(2,5,6)"}));
  CHECK_THROWS_MATCHES(gw::matmul(gw::zeros({2, 3, 4}), gw::zeros({3, 4, 5})), gw::ShapeError,
                       Says({"[matmul]", "(2)", "(3)"}));  // batch dims do not broadcast
  CHECK_THROWS_MATCHES(gw::matmul(gw::zeros({3}), gw::zeros({4})), gw::ShapeError,
                       Says({"[dot]", "(3)", "(4)"}));
  CHECK_THROWS_MATCHES(gw::matmul(gw::scalar_tensor(1.0), m23()), gw::ShapeError,
                       Says({"[matmul]", "at least 1 dim"}));
  CHECK_THROWS_MATCHES(gw::mm(gw::zeros({2, 3, 4}), m23()), gw::ShapeError,
                       Says({"[mm]", "(2,3,4)"}));
  CHECK_THROWS_MATCHES(gw::bmm(gw::zeros({2, 3, 4}), gw::zeros({3, 4, 5})), gw::ShapeError,
                       Says({"[bmm]", "(2,3,4)", "(3,4,5)"}));
  CHECK_THROWS_MATCHES(gw::bmm(m23(), m23()), gw::ShapeError, Says({"[bmm]", "3-D"}));
  CHECK_THROWS_MATCHES(gw::dot(m23(), m23()), gw::ShapeError, Says({"[dot]"}));
  CHECK_THROWS_MATCHES(gw::linear(m23(), gw::zeros({3})), gw::ShapeError,
                       Says({"[linear]", "(3)"}));
  CHECK_THROWS_MATCHES(gw::linear(m23(), gw::zeros({4, 5})), gw::ShapeError, Says({"(2,3)"}));
}

TEST_CASE("dims out of range", "[core][errors]") {
  Tensor x = m23();
  CHECK_THROWS_MATCHES(gw::sum(x, {2}), gw::IndexError,
                       Says({"[sum]", "dim 2", "2 dims", "-2..1"}));
  CHECK_THROWS_MATCHES(gw::mean(x, {-3}), gw::IndexError, Says({"[mean]", "dim -3"}));
  CHECK_THROWS_MATCHES(x.transpose(0, 2), gw::IndexError, Says({"[transpose]", "dim 2"}));
  CHECK_THROWS_MATCHES(gw::softmax(x, 2), gw::IndexError, Says({"[softmax]", "dim 2"}));
  CHECK_THROWS_MATCHES(gw::log_softmax(x, -3), gw::IndexError, Says({"[log_softmax]", "dim -3"}));
  CHECK_THROWS_MATCHES(x.size(5), gw::IndexError, Says({"[size]", "dim 5"}));
  CHECK_THROWS_MATCHES(gw::scalar_tensor(1.0).size(0), gw::IndexError, Says({"[size]", "0-dim"}));
  CHECK_THROWS_MATCHES(gw::scalar_tensor(1.0).stride(-1), gw::IndexError,
                       Says({"[stride]", "0-dim"}));
  CHECK_THROWS_MATCHES(gw::split(gw::scalar_tensor(1.0), 1), gw::ShapeError,
                       Says({"[split]", "0-dim"}));
  CHECK_THROWS_MATCHES(gw::scalar_tensor(1.0).slice(0, 0, 1), gw::IndexError,
                       Says({"[slice]", "0-dim"}));
  CHECK_THROWS_MATCHES(gw::scalar_tensor(1.0).narrow(0, 0, 1), gw::IndexError,
                       Says({"[narrow]", "0-dim"}));
  CHECK_THROWS_MATCHES(gw::scalar_tensor(1.0).squeeze(5), gw::IndexError,
                       Says({"[squeeze]", "dim 5"}));
  CHECK(gw::scalar_tensor(1.0).squeeze(-1).dim() == 0);
  CHECK_THROWS_MATCHES(m23().narrow(1, 1, INT64_MAX), gw::IndexError,
                       Says({"[narrow]", "start 1", "9223372036854775807"}));
  CHECK_THROWS_MATCHES(gw::chunk(gw::scalar_tensor(1.0), 1), gw::ShapeError,
                       Says({"[chunk]", "0-dim"}));
  CHECK_THROWS_MATCHES(x.unsqueeze(3), gw::IndexError, Says({"[unsqueeze]", "dim 3"}));
  CHECK_THROWS_MATCHES(x.squeeze(2), gw::IndexError, Says({"[squeeze]", "dim 2"}));
  CHECK_THROWS_MATCHES(gw::max(x, 2), gw::IndexError, Says({"[max]", "dim 2"}));
  CHECK_THROWS_MATCHES(gw::argmin(x, -5), gw::IndexError, Says({"[argmin]", "dim -5"}));
  CHECK_THROWS_MATCHES(gw::cat({x, x}, 2), gw::IndexError, Says({"[cat]", "dim 2"}));
  CHECK_THROWS_MATCHES(gw::stack({x, x}, 3), gw::IndexError, Says({"[stack]", "dim 3"}));
  CHECK_THROWS_MATCHES(gw::split(x, 1, 2), gw::IndexError, Says({"[split]", "dim 2"}));
  CHECK_THROWS_MATCHES(x.slice(-3, 0, 1), gw::IndexError, Says({"[slice]", "dim -3"}));
  CHECK_THROWS_MATCHES(gw::index_select(x, 2, gw::arange(1)), gw::IndexError,
                       Says({"[index_select]", "dim 2"}));
  CHECK_THROWS_MATCHES(x.permute({0, 2}), gw::IndexError, Says({"[permute]", "dim 2"}));
  CHECK(gw::wrap_dim(0, 0, "myop") == 0);
  CHECK(gw::wrap_dim(-1, 0, "myop") == 0);  // a 0-dim tensor accepts dims 0 and -1
  CHECK_THROWS_MATCHES(gw::wrap_dim(1, 0, "myop"), gw::IndexError, Says({"[myop]", "dim 1"}));
}

TEST_CASE("dims given twice or in the wrong order", "[core][errors]") {
  Tensor x = gw::zeros({2, 3, 4});
  CHECK_THROWS_MATCHES(gw::sum(x, {0, -3}), gw::InvalidArgumentError,
                       Says({"[sum]", "more than once"}));
  CHECK_THROWS_MATCHES(x.permute({0, 1, 1}), gw::InvalidArgumentError,
                       Says({"[permute]", "repeated"}));
  CHECK_THROWS_MATCHES(x.permute({0, 1}), gw::ShapeError, Says({"[permute]", "3 dims"}));
  CHECK_THROWS_MATCHES(x.flatten(2, 1), gw::InvalidArgumentError, Says({"[flatten]"}));
}

TEST_CASE("indices out of range", "[core][errors]") {
  Tensor x = m23();
  CHECK_THROWS_MATCHES(x.select(1, 3), gw::IndexError,
                       Says({"[select]", "index 3", "dim 1", "size 3"}));
  CHECK_THROWS_MATCHES(x.select(0, -3), gw::IndexError, Says({"[select]", "index -3", "size 2"}));
  CHECK_THROWS_MATCHES(x[2], gw::IndexError, Says({"[select]", "index 2"}));
  CHECK_THROWS_MATCHES(gw::scalar_tensor(1.0).select(0, 0), gw::IndexError,
                       Says({"[select]", "0-dim"}));
  CHECK_THROWS_MATCHES(x.narrow(1, 2, 2), gw::IndexError,
                       Says({"[narrow]", "start 2", "length 2", "size 3"}));
  CHECK_THROWS_MATCHES(x.narrow(0, 0, -1), gw::IndexError, Says({"[narrow]", "length -1"}));
  CHECK_THROWS_MATCHES(gw::index_select(x, 0, gw::from_vector<int64_t>({0, 5})), gw::IndexError,
                       Says({"[index_select]", "index 5", "size 2"}));
  CHECK_THROWS_MATCHES(gw::gather(x, 1, gw::from_vector<int64_t>({0, 4}, {1, 2})), gw::IndexError,
                       Says({"[gather]", "index 4", "size 3"}));
  CHECK_THROWS_MATCHES(gw::scatter_add(x, 0, gw::from_vector<int64_t>({7}, {1, 1}), gw::ones({1, 1})),
                       gw::IndexError, Says({"[scatter_add]", "index 7", "size 2"}));
  CHECK_THROWS_MATCHES(gw::embedding(x, gw::from_vector<int64_t>({2})), gw::IndexError,
                       Says({"index 2", "size 2"}));
  CHECK_THROWS_MATCHES(gw::one_hot(gw::from_vector<int64_t>({1, 3}), 3), gw::IndexError,
                       Says({"[one_hot]", "class 3", "num_classes 3"}));
  CHECK_THROWS_MATCHES(gw::one_hot(gw::from_vector<int64_t>({-1}), 3), gw::IndexError,
                       Says({"[one_hot]", "class -1"}));
}

TEST_CASE("negative indices are out of range for index ops, as in PyTorch", "[core][errors]") {
  // torch.index_select/gather/scatter_add_ reject negative index values ("index out of range
  // in self", "index -1 is out of bounds for dimension 1 with size 3").
  Tensor x = m23();
  CHECK_THROWS_MATCHES(gw::index_select(x, 0, gw::from_vector<int64_t>({-1})), gw::IndexError,
                       Says({"[index_select]", "index -1"}));
  CHECK_THROWS_MATCHES(gw::gather(x, 1, gw::from_vector<int64_t>({-1}, {1, 1})), gw::IndexError,
                       Says({"[gather]", "index -1"}));
  CHECK_THROWS_MATCHES(
      gw::scatter_add(x, 1, gw::from_vector<int64_t>({-1}, {1, 1}), gw::ones({1, 1})),
      gw::IndexError, Says({"[scatter_add]", "index -1"}));
}

TEST_CASE("index tensors of the wrong shape or dtype", "[core][errors]") {
  Tensor x = m23();
  CHECK_THROWS_MATCHES(gw::index_select(x, 0, gw::zeros({1, 1}, gw::kInt64)), gw::ShapeError,
                       Says({"[index_select]", "1-D", "(1,1)"}));
  CHECK_THROWS_MATCHES(gw::index_select(x, 0, gw::zeros({1})), gw::DTypeError,
                       Says({"[index_select]", "float32"}));
  CHECK_THROWS_MATCHES(gw::gather(x, 1, gw::zeros({2}, gw::kInt64)), gw::ShapeError,
                       Says({"[gather]", "1 dims", "2"}));
  CHECK_THROWS_MATCHES(gw::gather(x, 1, gw::zeros({3, 1}, gw::kInt64)), gw::ShapeError,
                       Says({"[gather]", "(3,1)", "(2,3)"}));
  CHECK_THROWS_MATCHES(x.scatter_add_(0, gw::zeros({1, 1}, gw::kInt64), gw::ones({1, 1}, gw::kFloat64)),
                       gw::DTypeError, Says({"[scatter_add]", "float64", "float32"}));
  CHECK_THROWS_MATCHES(gw::embedding(gw::zeros({3}), gw::zeros({1}, gw::kInt64)), gw::ShapeError,
                       Says({"[embedding]", "(3)"}));
  CHECK_THROWS_MATCHES(gw::one_hot(gw::zeros({2}, gw::kInt64), 0), gw::InvalidArgumentError,
                       Says({"[one_hot]", "got 0"}));
}

TEST_CASE("views that need a copy, and invalid shapes", "[core][errors]") {
  CHECK_THROWS_MATCHES(gw::ones({1}).expand({-5}), gw::ShapeError, Says({"[expand]", "-5"}));
  CHECK_THROWS_MATCHES(gw::ones({2, 1}).expand({2, -3}), gw::ShapeError, Says({"[expand]", "-3"}));
  CHECK_THROWS_MATCHES(gw::zeros({int64_t{1} << 32, int64_t{1} << 32}), gw::ShapeError,
                       Says({"[empty]", "(4294967296,4294967296)", "too large"}));
  CHECK_THROWS_MATCHES(gw::empty({int64_t{1} << 62, 2}, gw::kFloat32), gw::ShapeError,
                       Says({"[empty]", "too large"}));
  Tensor x = m23();
  CHECK_THROWS_MATCHES(x.t().view({6}), gw::ShapeError,
                       Says({"[view]", "(3,2)", "(1,3)", "(6)", "reshape"}));
  CHECK_THROWS_MATCHES(x.view({4}), gw::ShapeError, Says({"[view]", "(4)", "6 elements"}));
  CHECK_THROWS_MATCHES(x.reshape({-1, -1}), gw::ShapeError, Says({"[reshape]", "-1"}));
  CHECK_THROWS_MATCHES(x.reshape({4, -1}), gw::ShapeError, Says({"[reshape]", "(4,-1)", "6"}));
  CHECK_THROWS_MATCHES(x.reshape({-2, 3}), gw::ShapeError, Says({"[reshape]", "-2"}));
  CHECK_THROWS_MATCHES(x.expand({2, 4}), gw::ShapeError, Says({"[expand]", "(2,3)", "(2,4)"}));
  CHECK_THROWS_MATCHES(x.expand({3}), gw::ShapeError, Says({"[expand]", "(2,3)", "(3)"}));
  CHECK_THROWS_MATCHES(gw::zeros({2, 3, 4}).t(), gw::ShapeError, Says({"[t]", "(2,3,4)"}));
  CHECK_THROWS_MATCHES(x.slice(1, 0, 3, 0), gw::InvalidArgumentError,
                       Says({"[slice]", "step", "0"}));
  CHECK_THROWS_MATCHES(gw::from_vector<float>({1, 2, 3}, {2, 2}), gw::ShapeError,
                       Says({"[from_vector]", "3 values", "(2,2)"}));
  CHECK_THROWS_MATCHES(gw::tensor({{1, 2}, {3}}), gw::ShapeError, Says({"[tensor]", "ragged"}));
  CHECK_THROWS_MATCHES(gw::zeros({2, -1}), gw::ShapeError, Says({"[empty]", "(2,-1)"}));
  CHECK_THROWS_MATCHES(gw::eye(-1), gw::ShapeError, Says({"[eye]", "-1"}));
}

TEST_CASE("dtypes an operation does not support", "[core][errors]") {
  Tensor ints = gw::zeros({3}, gw::kInt64);
  Tensor flags = gw::zeros({3}, gw::kBool);
  CHECK_THROWS_MATCHES(gw::mean(ints), gw::DTypeError, Says({"[mean]", "int64"}));
  CHECK_THROWS_MATCHES(gw::var(ints), gw::DTypeError, Says({"[var]", "int64"}));
  CHECK_THROWS_MATCHES(gw::softmax(ints, 0), gw::DTypeError, Says({"[softmax]", "int64"}));
  CHECK_THROWS_MATCHES(gw::logsumexp(gw::zeros({3}, gw::kInt32), {0}), gw::DTypeError,
                       Says({"[logsumexp]", "int32"}));
  CHECK_THROWS_MATCHES(gw::where(ints, ints, ints), gw::DTypeError,
                       Says({"[where]", "bool", "int64"}));
  CHECK_THROWS_MATCHES(gw::masked_fill(ints, ints, 1), gw::DTypeError,
                       Says({"[masked_fill]", "int64"}));
  CHECK_THROWS_MATCHES(ints.masked_fill_(ints, 1), gw::DTypeError,
                       Says({"[masked_fill_]", "int64"}));
  CHECK_THROWS_MATCHES(gw::sub(flags, flags), gw::DTypeError, Says({"[sub]", "bool"}));
  CHECK_THROWS_MATCHES(gw::neg(flags), gw::DTypeError, Says({"[neg]", "bool"}));
  CHECK_THROWS_MATCHES(gw::mm(gw::zeros({2, 2}, gw::kBool), gw::zeros({2, 2}, gw::kBool)),
                       gw::DTypeError, Says({"[mm]", "bool"}));
  CHECK_THROWS_MATCHES(gw::mm(gw::zeros({2, 2}), gw::zeros({2, 2}, gw::kFloat64)), gw::DTypeError,
                       Says({"[mm]", "float32", "float64"}));
  CHECK_THROWS_MATCHES(gw::zeros({2}).data_ptr<double>(), gw::DTypeError,
                       Says({"[data_ptr]", "float64", "float32"}));
  CHECK_THROWS_MATCHES(gw::randn({2}, gw::kInt64), gw::DTypeError, Says({"int64"}));
}

TEST_CASE("in-place writes that cannot be done", "[core][errors]") {
  SECTION("into an expanded tensor") {
    Tensor e = gw::ones({3}).expand({2, 3});
    CHECK_THROWS_MATCHES(e.add_(1), gw::InvalidArgumentError,
                         Says({"[add_]", "expanded", "(2,3)", "(0,1)"}));
    CHECK_THROWS_MATCHES(e.mul_(gw::ones({2, 3})), gw::InvalidArgumentError,
                         Says({"[mul_]", "expanded"}));
  }
  SECTION("into an expanded tensor, by any in-place op or out=") {
    Tensor e = gw::zeros({1}).expand({4});
    CHECK_THROWS_MATCHES(e.copy_(gw::arange(4).to(gw::kFloat32)), gw::InvalidArgumentError,
                         Says({"[copy_]", "expanded", "(4)", "(0)"}));
    CHECK_THROWS_MATCHES(e.clamp_(0.0, 1.0), gw::InvalidArgumentError,
                         Says({"[clamp_]", "expanded"}));
    CHECK_THROWS_MATCHES(e.scatter_add_(0, gw::zeros({1}, gw::kInt64), gw::ones({1})),
                         gw::InvalidArgumentError, Says({"[scatter_add_]", "expanded"}));
    CHECK_THROWS_MATCHES(e.uniform_(0, 1), gw::InvalidArgumentError,
                         Says({"[uniform_]", "expanded"}));
    CHECK_THROWS_MATCHES(gw::add_out(e, gw::ones({4}), gw::ones({4})), gw::InvalidArgumentError,
                         Says({"[add_out]", "expanded"}));
    CHECK(e.fill_(2).to_vector<float>() == std::vector<float>(4, 2.f));  // one value: allowed
    Tensor empty = gw::zeros({1, 0}).expand({3, 0});  // nothing to write: allowed, as in PyTorch
    CHECK_NOTHROW(empty.copy_(gw::ones({3, 0})));
  }
  SECTION("out= overlapping an input is read before it is written") {
    Tensor a = gw::add(gw::arange(6).to(gw::kFloat32), 1.0);  // 1 .. 6
    Tensor tail = a.slice(0, 1, 6);
    gw::mul_out(tail, a.slice(0, 0, 5), gw::full({5}, 2.0));
    CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 4, 6, 8, 10});
    gw::add_out(a, a, a);  // out is an input itself: element by element
    CHECK(a.to_vector<float>() == std::vector<float>{2, 4, 8, 12, 16, 20});
  }
  SECTION("a floating result into an integer tensor") {
    Tensor ints = gw::zeros({3}, gw::kInt64);
    CHECK_THROWS_MATCHES(ints.add_(2.5), gw::DTypeError,
                         Says({"[add_]", "float32", "int64"}));
    CHECK_THROWS_MATCHES(ints.mul_(gw::ones({3})), gw::DTypeError,
                         Says({"[mul_]", "float32", "int64"}));
    CHECK_THROWS_MATCHES(ints.sub_(gw::ones({3}, gw::kFloat64)), gw::DTypeError,
                         Says({"[sub_]", "float64"}));
    CHECK_THROWS_MATCHES(ints.div_(2), gw::DTypeError, Says({"[div_]", "int64"}));
    CHECK_THROWS_MATCHES(ints.clamp_(0.5, std::nullopt), gw::DTypeError,
                         Says({"[clamp_]", "float32", "int64"}));
    CHECK_THROWS_MATCHES(gw::zeros({3}, gw::kBool).add_(1), gw::DTypeError,
                         Says({"[add_]", "int64", "bool"}));
    Tensor i32 = gw::zeros({3}, gw::kInt32);
    CHECK_THROWS_MATCHES(i32 += gw::ones({3}), gw::DTypeError, Says({"[add_]", "int32"}));
    CHECK(ints.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});  // untouched
    CHECK(ints.clamp_(1, 2).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  }
  SECTION("out= tensors of the wrong shape or dtype") {
    Tensor out = gw::zeros({3});
    CHECK_THROWS_MATCHES(gw::add_out(out, m23(), m23()), gw::ShapeError,
                         Says({"[add_out]", "(3)", "(2,3)"}));
    Tensor out64 = gw::zeros({2, 3}, gw::kFloat64);
    CHECK_THROWS_MATCHES(gw::mul_out(out64, m23(), m23()), gw::DTypeError,
                         Says({"[mul_out]", "float64", "float32"}));
  }
}

TEST_CASE("item() needs exactly one element", "[core][errors]") {
  CHECK_THROWS_MATCHES(m23().item<float>(), gw::InvalidArgumentError,
                       Says({"[item]", "6 elements", "(2,3)"}));
  CHECK_THROWS_MATCHES(gw::zeros({0}).item(), gw::InvalidArgumentError,
                       Says({"[item]", "0 elements"}));
}

TEST_CASE("ranges and random parameters out of their domain", "[core][errors]") {
  CHECK_THROWS_MATCHES(gw::arange(0, 5, -1), gw::InvalidArgumentError,
                       Says({"[arange]", "step -1", "0", "5"}));
  CHECK_THROWS_MATCHES(gw::arange(5, 0), gw::InvalidArgumentError, Says({"[arange]", "step 1"}));
  CHECK_THROWS_MATCHES(gw::arange(0, 1, 0), gw::InvalidArgumentError,
                       Says({"[arange]", "nonzero"}));
  CHECK_THROWS_MATCHES(gw::arange(0, std::numeric_limits<double>::infinity(), 1),
                       gw::InvalidArgumentError, Says({"[arange]", "inf", "finite number"}));
  // A float that no integer dtype holds (PyTorch: "cannot be converted ... without overflow").
  CHECK_THROWS_MATCHES(gw::full({2}, std::nan(""), gw::kInt64), gw::InvalidArgumentError,
                       Says({"nan", "int64", "overflow"}));
  CHECK_THROWS_MATCHES(gw::full({2}, 3e9, gw::kInt32), gw::InvalidArgumentError,
                       Says({"3e+09", "int32"}));
  CHECK_THROWS_MATCHES(gw::full({2}, 2147483648.0, gw::kInt32), gw::InvalidArgumentError,
                       Says({"2147483648 cannot", "int32"}));  // every digit: it does not fit
  CHECK_THROWS_MATCHES(gw::full({1}, int64_t{1} << 40, gw::kInt32), gw::InvalidArgumentError,
                       Says({"1099511627776", "int32"}));  // wrapped to 0 before
  CHECK_THROWS_MATCHES(gw::arange(0.0, 1e20, 1e19, gw::kInt64), gw::InvalidArgumentError,
                       Says({"int64", "overflow"}));
  CHECK(gw::arange(0, 5, 2, gw::kInt32).to_vector<int32_t>() == std::vector<int32_t>{0, 2, 4});
  CHECK(gw::full({1}, -2.5, gw::kInt64).item<int64_t>() == -2);  // truncated, as PyTorch
  CHECK_THROWS_MATCHES(gw::linspace(0, 1, -2), gw::InvalidArgumentError,
                       Says({"[linspace]", "-2"}));
  gw::Generator gen(0);
  CHECK_THROWS_MATCHES(gw::randint(5, 5, {2}, gen), gw::InvalidArgumentError,
                       Says({"[randint]", "5 and 5"}));
  CHECK_THROWS_MATCHES(gw::randperm(-1, gen), gw::InvalidArgumentError,
                       Says({"[randperm]", "-1"}));
  Tensor t = gw::zeros({2});
  CHECK_THROWS_MATCHES(gw::uniform_(t, 1, 0, gen), gw::InvalidArgumentError,
                       Says({"[uniform_]", "1", "0"}));
  CHECK_THROWS_MATCHES(gw::normal_(t, 0, -1, gen), gw::InvalidArgumentError,
                       Says({"[normal_]", "-1"}));
  CHECK_THROWS_MATCHES(gw::bernoulli_(t, 1.5, gen), gw::InvalidArgumentError,
                       Says({"[bernoulli_]", "1.5"}));
  CHECK_THROWS_MATCHES(gw::bernoulli(gw::from_vector<float>({0.5f, 2.f}), gen),
                       gw::InvalidArgumentError, Says({"[bernoulli]", "2", "index 1"}));
  CHECK_THROWS_MATCHES(gw::gelu(t, "fast"), gw::InvalidArgumentError, Says({"[gelu]", "fast"}));
  CHECK_THROWS_MATCHES(gw::clamp(t, std::nullopt, std::nullopt), gw::InvalidArgumentError,
                       Says({"[clamp]"}));
  // torch: "Integers to negative integer powers are not allowed."
  CHECK_THROWS_MATCHES(gw::pow(gw::from_vector<int64_t>({2, 3}), -1), gw::Error,
                       Says({"[pow]", "-1"}));
}

TEST_CASE("reductions over nothing", "[core][errors]") {
  CHECK_THROWS_MATCHES(gw::max(gw::zeros({0})), gw::ShapeError, Says({"[max]", "size 0"}));
  CHECK_THROWS_MATCHES(gw::amin(gw::zeros({2, 0}), {1}), gw::ShapeError,
                       Says({"[amin]", "(2,0)"}));
  CHECK_THROWS_MATCHES(gw::argmax(gw::zeros({0})), gw::ShapeError, Says({"[argmax]", "size 0"}));
  CHECK_THROWS_MATCHES(gw::max(gw::zeros({3, 0}), 1), gw::ShapeError, Says({"[max]", "(3,0)"}));
}

TEST_CASE("joining and splitting mismatched tensors", "[core][errors]") {
  Tensor x = m23();
  CHECK_THROWS_MATCHES(gw::cat({x, gw::zeros({2, 4})}), gw::ShapeError,
                       Says({"[cat]", "(2,4)", "(2,3)", "dim 0"}));
  CHECK_THROWS_MATCHES(gw::cat({x, gw::zeros({3})}), gw::ShapeError,
                       Says({"[cat]", "1 dims", "2"}));
  CHECK_THROWS_MATCHES(gw::cat({}), gw::InvalidArgumentError, Says({"[cat]", "non-empty"}));
  CHECK_THROWS_MATCHES(gw::cat({gw::scalar_tensor(1.0)}), gw::ShapeError,
                       Says({"[cat]", "zero-dimensional"}));
  CHECK_THROWS_MATCHES(gw::stack({x, gw::zeros({3, 2})}), gw::ShapeError,
                       Says({"[stack]", "(2,3)", "(3,2)"}));
  CHECK_THROWS_MATCHES(gw::stack({}), gw::InvalidArgumentError, Says({"[stack]"}));
  CHECK_THROWS_MATCHES(gw::split(x, std::vector<int64_t>{1, 3}, 1), gw::ShapeError,
                       Says({"[split]", "4", "size 3"}));
  CHECK_THROWS_MATCHES(gw::split(x, std::vector<int64_t>{3, -1}, 1), gw::InvalidArgumentError,
                       Says({"[split]", "-1"}));
  CHECK_THROWS_MATCHES(gw::split(x, 0), gw::InvalidArgumentError, Says({"[split]", "got 0"}));
  CHECK_THROWS_MATCHES(gw::chunk(x, 0), gw::InvalidArgumentError, Says({"[chunk]", "got 0"}));
}

TEST_CASE("using an undefined tensor", "[core][errors]") {
  Tensor u;
  CHECK_THROWS_MATCHES(u.dim(), gw::StateError, Says({"[Tensor]", "undefined"}));
  CHECK_THROWS_MATCHES(u.clone(), gw::StateError, Says({"undefined"}));
  CHECK_THROWS_MATCHES(gw::add(u, m23()), gw::StateError, Says({"undefined"}));
  CHECK_THROWS_MATCHES(gw::sum(u), gw::StateError, Says({"undefined"}));
  CHECK_THROWS_MATCHES(u.fill_(1), gw::StateError, Says({"undefined"}));
  CHECK_THROWS_MATCHES(m23().copy_(u), gw::StateError, Says({"undefined"}));
}

// This program links core alone, where asking for a gradient (with_requires_grad,
// requires_grad_) does not link: options that require grad can only be set by hand, and a
// factory refuses to make a tensor whose history nothing would record.
TEST_CASE("requires_grad from a factory without autograd", "[core][errors]") {
  gw::TensorOptions ints(gw::kInt32), floats(gw::kFloat32);
  ints.requires_grad = floats.requires_grad = true;
  CHECK_THROWS_MATCHES(gw::zeros({2}, ints), gw::DTypeError,
                       Says({"[zeros]", "requires_grad", "int32"}));
  CHECK_THROWS_MATCHES(gw::zeros({2}, floats), gw::StateError,
                       Says({"[zeros]", "autograd is not installed", "with_requires_grad"}));
  gw::Generator gen(1);
  CHECK_THROWS_MATCHES(gw::randn({2}, gen, floats), gw::StateError, Says({"[randn]", "autograd"}));
  CHECK_THROWS_MATCHES(gw::arange(0, 3, 1, floats), gw::StateError, Says({"[arange]", "autograd"}));
  CHECK_THROWS_MATCHES(gw::empty({2}, floats), gw::StateError, Says({"[empty]", "autograd"}));
}

TEST_CASE("bad thread counts and device names", "[core][errors]") {
  const int before = gw::get_num_threads();
  CHECK_THROWS_MATCHES(gw::set_num_threads(0), gw::InvalidArgumentError,
                       Says({"[set_num_threads]", "got 0"}));
  CHECK_THROWS_MATCHES(gw::set_num_threads(-3), gw::InvalidArgumentError,
                       Says({"[set_num_threads]", "-3"}));
  CHECK(gw::get_num_threads() == before);
  CHECK_THROWS_MATCHES(gw::Device::parse("gpu"), gw::InvalidArgumentError,
                       Says({"[Device]", "\"gpu\""}));
  CHECK_THROWS_MATCHES(gw::Device::parse("cuda:x"), gw::InvalidArgumentError,
                       Says({"[Device]", "cuda:x"}));
  CHECK_THROWS_MATCHES(gw::Device::parse("cuda:-1"), gw::InvalidArgumentError,
                       Says({"[Device]"}));
  CHECK_THROWS_MATCHES(gw::Device::parse("CPU"), gw::InvalidArgumentError, Says({"[Device]"}));
  CHECK(gw::Device::parse("cpu") == gw::kCPU);
  CHECK(gw::Device::parse("cuda:2") == gw::cuda_device(2));
  CHECK(gw::Device::parse("cuda") == gw::cuda_device(0));
}
