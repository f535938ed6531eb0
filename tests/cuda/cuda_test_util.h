// Helpers of the CUDA tests: skipping without a device, and CPU/CUDA comparisons.
//
// A case that needs a GPU starts with GW_REQUIRE_CUDA_DEVICE(), which skips it (tests/skip.h)
// with the reason when there is none:
//
//   TEST_CASE("...", "[cuda]") {
//     GW_REQUIRE_CUDA_DEVICE();
//     ...
//   }
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda/device.h"
#include "core/ops.h"
#include "tests/skip.h"

#define GW_REQUIRE_CUDA_DEVICE()                                            \
  do {                                                                      \
    if (!::gw::cuda::is_available()) {                                      \
      GW_SKIP("no CUDA device (" << ::gw::cuda::no_device_reason() << ")"); \
    }                                                                       \
  } while (0)

namespace cuda_test {

inline const gw::Device kGpu = gw::cuda_device(0);

// Tolerances per dtype: relative and absolute, applied as |a - b| <= atol + rtol * |b|.
struct Tolerance {
  double rtol, atol;
};
inline Tolerance tolerance(gw::DType t) {
  switch (t) {
    case gw::DType::Float32: return {1e-5, 1e-6};
    case gw::DType::Float64: return {1e-11, 1e-12};
    case gw::DType::Float16: return {1e-2, 1e-2};
    case gw::DType::BFloat16: return {5e-2, 5e-2};
    default: return {0, 0};  // integers and bools compare exactly
  }
}

// The CUDA result `gpu` (any device) matches the CPU reference `cpu` elementwise: same
// shape, values within the tolerance of `gpu`'s dtype; NaNs must be NaN on both sides.
inline void expect_close(const gw::Tensor& cpu, const gw::Tensor& gpu, const std::string& what,
                         std::optional<Tolerance> override = std::nullopt) {
  INFO(what);
  REQUIRE(gpu.sizes() == cpu.sizes());
  const Tolerance tol = override.value_or(tolerance(gpu.dtype()));
  std::vector<double> expected = cpu.to_vector<double>();
  std::vector<double> actual = gpu.to(gw::kCPU).to_vector<double>();
  REQUIRE(expected.size() == actual.size());
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], a = actual[i];
    const bool ok = (std::isnan(e) && std::isnan(a)) || e == a ||
                    std::abs(a - e) <= tol.atol + tol.rtol * std::abs(e);
    if (!ok && bad++ == 0) {
      first = "element " + std::to_string(i) + ": cpu " + std::to_string(e) + " vs cuda " +
              std::to_string(a);
    }
  }
  INFO(first);
  CHECK(bad == 0);
}

}  // namespace cuda_test
