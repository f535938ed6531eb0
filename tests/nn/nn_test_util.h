// Helpers shared by the nn tests: element access, closeness with a readable failure, and
// gradcheck with its message.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "autograd/autograd.h"
#include "nn/nn.h"

namespace nn_test {

inline std::vector<double> values(const gw::Tensor& t) { return t.to_vector<double>(); }

// max |a - b| / max |b| (the error relative to the expected tensor's scale), after checking
// that the shapes agree.
inline double rel_error(const gw::Tensor& got, const gw::Tensor& expected) {
  REQUIRE(gw::shape_str(got.sizes()) == gw::shape_str(expected.sizes()));
  std::vector<double> a = values(got), b = values(expected);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

// Elementwise |got - expected| <= atol + rtol * |expected| against plain C++ values.
inline void check_values(const gw::Tensor& got, const std::vector<double>& expected,
                         double rtol = 1e-5, double atol = 1e-6) {
  std::vector<double> a = values(got);
  REQUIRE(a.size() == expected.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": got " << a[i] << ", expected " << expected[i]);
    CHECK(std::abs(a[i] - expected[i]) <= atol + rtol * std::abs(expected[i]));
  }
}

inline gw::Tensor randn64(gw::Shape shape, gw::Generator& gen, bool requires_grad = true) {
  gw::Tensor t = gw::randn(std::move(shape), gen, gw::kFloat64);
  if (requires_grad) t.requires_grad_();
  return t;
}

// NN_GRADCHECK(fn, inputs): variadic so that lambda captures like [a, b] need no parentheses.
#define NN_GRADCHECK(...)                                     \
  do {                                                        \
    auto nn_gc_result = gw::autograd::gradcheck(__VA_ARGS__); \
    INFO(nn_gc_result.message);                               \
    CHECK(nn_gc_result.ok);                                   \
  } while (0)

// A file path in the temp directory that is removed when the object goes.
class TempFile {
 public:
  explicit TempFile(const std::string& stem) {
    static int counter = 0;
    path_ =
        (std::filesystem::temp_directory_path() / (stem + "_" + std::to_string(::getpid()) + "_" +
                                                   std::to_string(counter++) + ".safetensors"))
            .string();
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace nn_test
