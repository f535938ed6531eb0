// Printing matches PyTorch 1.13's str(tensor) (with "torch." dropped from dtype names); the
// expected strings were produced by Debian's python3-torch.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/ops.h"
#include "tests/core/test_util.h"

using gw::Tensor;

using core_test::from_bits;

TEST_CASE("print: each dtype", "[core][print]") {
  CHECK(gw::tensor({{1.f, 2.f}, {3.f, 4.f}}).str() == "tensor([[1., 2.],\n        [3., 4.]])");
  CHECK(gw::tensor<int64_t>({1, 2, 3}).str() == "tensor([1, 2, 3])");
  CHECK(gw::tensor<bool>({true, false}).str() == "tensor([ True, False])");
  CHECK(gw::tensor<double>({1.25, -3.}).str() == "tensor([ 1.2500, -3.0000], dtype=float64)");
  CHECK(gw::tensor<int32_t>({{-7, 100}}).str() == "tensor([[ -7, 100]], dtype=int32)");
  CHECK(from_bits({0x3800, 0xc000, 0x7bff}, gw::kFloat16).str() ==
        "tensor([ 5.0000e-01, -2.0000e+00,  6.5504e+04], dtype=float16)");
  CHECK(from_bits({0x3fc0, 0x4040}, gw::kBFloat16).str() ==
        "tensor([1.5000, 3.0000], dtype=bfloat16)");
  CHECK(gw::tensor<int64_t>({123456789012, -5}).str() == "tensor([123456789012,           -5])");
}

TEST_CASE("print: 0-dim tensors", "[core][print]") {
  CHECK(gw::scalar_tensor(3.5).str() == "tensor(3.5000)");
  CHECK(gw::scalar_tensor(-0.0).str() == "tensor(-0.)");
  CHECK(gw::scalar_tensor(5, gw::kInt32).str() == "tensor(5, dtype=int32)");
  CHECK(gw::scalar_tensor(true).str() == "tensor(True)");
}

TEST_CASE("print: float styles follow PyTorch's formatter", "[core][print]") {
  auto f = [](std::vector<float> v) { return gw::from_vector(v).str(); };
  CHECK(f({0.1f, 2.5f}) == "tensor([0.1000, 2.5000])");
  CHECK(f({-1.5f, 2.25f, 0.f}) == "tensor([-1.5000,  2.2500,  0.0000])");
  CHECK(f({0.f, 0.f, 0.f}) == "tensor([0., 0., 0.])");
  // Scientific when values are tiny, huge, or span more than three orders of magnitude.
  CHECK(f({1e-5f, 1.f}) == "tensor([1.0000e-05, 1.0000e+00])");
  CHECK(f({1e9f, 1.f}) == "tensor([1.0000e+09, 1.0000e+00])");
  CHECK(f({0.5f, 2000.25f}) == "tensor([5.0000e-01, 2.0002e+03])");
  CHECK(f({NAN, INFINITY, -INFINITY, 1.5f}) == "tensor([   nan,    inf,   -inf, 1.5000])");
  CHECK(f({NAN, 2.f}) == "tensor([nan, 2.])");
}

TEST_CASE("print: empty tensors", "[core][print]") {
  CHECK(gw::zeros({0}).str() == "tensor([])");
  CHECK(gw::zeros({2, 0}).str() == "tensor([], size=(2, 0))");
  CHECK(gw::zeros({0}, gw::kInt64).str() == "tensor([], dtype=int64)");
}

TEST_CASE("print: nesting, views and line wrapping", "[core][print]") {
  CHECK(gw::arange(8.0).reshape({2, 2, 2}).str() ==
        "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
  CHECK(gw::arange(24.0).reshape({2, 3, 2, 2}).slice(2, 0, 1).str() ==
        "tensor([[[[ 0.,  1.]],\n\n         [[ 4.,  5.]],\n\n         [[ 8.,  9.]]],\n\n\n"
        "        [[[12., 13.]],\n\n         [[16., 17.]],\n\n         [[20., 21.]]]])");
  CHECK(gw::tensor<int64_t>({{1, 2, 3}, {4, 5, 6}}).t().str() ==
        "tensor([[1, 4],\n        [2, 5],\n        [3, 6]])");
  CHECK((gw::arange(30.0) / 4).str() ==
        "tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000, 1.2500, 1.5000, 1.7500, 2.0000,\n"
        "        2.2500, 2.5000, 2.7500, 3.0000, 3.2500, 3.5000, 3.7500, 4.0000, 4.2500,\n"
        "        4.5000, 4.7500, 5.0000, 5.2500, 5.5000, 5.7500, 6.0000, 6.2500, 6.5000,\n"
        "        6.7500, 7.0000, 7.2500])");
  // A suffix that would run past 80 columns goes on its own line.
  CHECK((gw::arange(0, 12, 1, gw::kFloat64) / 3).str() ==
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667,\n"
        "        3.0000, 3.3333, 3.6667], dtype=float64)");
  CHECK((gw::arange(0, 9, 1, gw::kFloat64) / 3).str() ==
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667],\n"
        "       dtype=float64)");
}

TEST_CASE("print: summarized beyond 1000 elements", "[core][print]") {
  CHECK(gw::arange(2000).str() == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  CHECK(gw::arange(1200.0).reshape({40, 30}).str() ==
        "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 2.7000e+01, 2.8000e+01,\n"
        "         2.9000e+01],\n"
        "        [3.0000e+01, 3.1000e+01, 3.2000e+01,  ..., 5.7000e+01, 5.8000e+01,\n"
        "         5.9000e+01],\n"
        "        [6.0000e+01, 6.1000e+01, 6.2000e+01,  ..., 8.7000e+01, 8.8000e+01,\n"
        "         8.9000e+01],\n"
        "        ...,\n"
        "        [1.1100e+03, 1.1110e+03, 1.1120e+03,  ..., 1.1370e+03, 1.1380e+03,\n"
        "         1.1390e+03],\n"
        "        [1.1400e+03, 1.1410e+03, 1.1420e+03,  ..., 1.1670e+03, 1.1680e+03,\n"
        "         1.1690e+03],\n"
        "        [1.1700e+03, 1.1710e+03, 1.1720e+03,  ..., 1.1970e+03, 1.1980e+03,\n"
        "         1.1990e+03]])");
  std::string s = gw::arange(1100).reshape({11, 10, 10}).str();
  CHECK(s.rfind("tensor([[[   0,    1,    2,  ...,    7,    8,    9],\n", 0) == 0);
  CHECK(s.find("         ...,\n") != std::string::npos);
  CHECK(s.find(" 299]],\n\n        ...,\n\n        [[ 800,  801,") != std::string::npos);
  CHECK(s.size() > 1000);
  CHECK(s.find("500") == std::string::npos);  // middle rows are elided
  CHECK(s.substr(s.size() - 45) == "[1090, 1091, 1092,  ..., 1097, 1098, 1099]]])");
  CHECK(gw::zeros({1001}).str() == "tensor([0., 0., 0.,  ..., 0., 0., 0.])");
  CHECK(gw::zeros({1000}).str().find("...") == std::string::npos);
}

TEST_CASE("print: suffixes, operator<< and undefined tensors", "[core][print]") {
  std::ostringstream os;
  os << gw::tensor<int64_t>({4, 5}) << "|" << gw::scalar_tensor(2.5, gw::kFloat64);
  CHECK(os.str() == "tensor([4, 5])|tensor(2.5000, dtype=float64)");
  CHECK(Tensor().str() == "tensor(undefined)");
}
