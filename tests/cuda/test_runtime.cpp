// The CUDA runtime layer: errors, devices, streams, the caching allocator, host <-> device
// copies. The first cases need no GPU and check what a machine without one must do.
#include <catch2/catch.hpp>

#include <cstring>

#include "core/backend.h"
#include "core/cuda/allocator.h"
#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/ops.h"
#include "tests/cuda/cuda_test_util.h"

using Catch::Matchers::Contains;
using cuda_test::kGpu;

namespace {
// A "CUDA" tensor over host memory: no device is touched until a kernel reads it, which lets
// the device checks of the front end be tested on any machine.
gw::Tensor fake_cuda_tensor(std::vector<float>& storage, gw::Shape shape) {
  return gw::from_blob(storage.data(), std::move(shape), gw::kFloat32, {}, kGpu);
}
}  // namespace

TEST_CASE("GW_CUDA_CHECK names the call and the error", "[cuda][error]") {
  auto fails = [] { GW_CUDA_CHECK(cudaErrorMemoryAllocation); };
  REQUIRE_THROWS_AS(fails(), gw::CudaError);
  try {
    fails();
  } catch (const gw::CudaError& e) {
    CHECK(e.code() == gw::ErrorCode::kCuda);
    CHECK_THAT(e.what(), Contains("cudaErrorMemoryAllocation") && Contains("(2)") &&
                             Contains("[cuda]") && Contains("test_runtime.cpp"));
  }
  auto blas_fails = [] { GW_CUDA_CHECK(CUBLAS_STATUS_NOT_INITIALIZED); };
  REQUIRE_THROWS_AS(blas_fails(), gw::CudaError);
  CHECK_THAT(gw::cuda::error_message(CUBLAS_STATUS_INVALID_VALUE, "cublasSgemm(...)"),
             Contains("cublasSgemm(...)") && Contains("CUBLAS_STATUS_INVALID_VALUE"));
  CHECK_NOTHROW([] { GW_CUDA_CHECK(cudaSuccess); }());
}

TEST_CASE("device_count never throws and agrees with is_available", "[cuda][device]") {
  int n = -1;
  REQUIRE_NOTHROW(n = gw::cuda::device_count());
  CHECK(n >= 0);
  CHECK(gw::cuda::is_available() == (n > 0));
  CHECK(gw::cuda::no_device_reason().empty() == (n > 0));
}

TEST_CASE("core dispatches CUDA tensors to the CUDA backend", "[cuda][device]") {
  CHECK_NOTHROW(gw::backend_for(gw::DeviceType::CUDA, "test"));
  CHECK(gw::backend_for(gw::DeviceType::CUDA, "test").device_type() == gw::DeviceType::CUDA);
}

TEST_CASE("CUDA tensors on a missing device raise a CudaError naming it", "[cuda][device]") {
  const int n = gw::cuda::device_count();
  // Without a GPU every index is missing; with one, the first index past the last.
  const gw::Device missing = gw::cuda_device(n);
  try {
    gw::zeros({2}, missing);
    FAIL("zeros on " << missing << " did not throw");
  } catch (const gw::CudaError& e) {
    CHECK_THAT(e.what(), Contains("[cuda allocate]") && Contains(missing.str()));
  }
  CHECK_THROWS_AS(gw::ones({3}).to(missing), gw::CudaError);
  CHECK_THROWS_AS(gw::empty({0}, missing), gw::CudaError);
}

TEST_CASE("mixed-device ops name the op and both devices", "[cuda][device]") {
  std::vector<float> host(6, 1.f);
  std::vector<int64_t> host_index(6, 0);
  gw::Tensor g = fake_cuda_tensor(host, {2, 3});
  gw::Tensor g_index = gw::from_blob(host_index.data(), {2, 3}, gw::kInt64, {}, kGpu);
  gw::Tensor c = gw::ones({2, 3});
  gw::Tensor c_index = gw::zeros({2, 3}, gw::kInt64);
  auto expect = [](auto&& op, const char* name) {
    try {
      op();
      FAIL(name << " did not throw");
    } catch (const gw::InvalidArgumentError& e) {
      CHECK_THAT(e.what(),
                 Contains(std::string("[") + name + "]") && Contains("cpu") && Contains("cuda:0"));
    }
  };
  expect([&] { gw::add(c, g); }, "add");
  expect([&] { gw::mul(g, c); }, "mul");
  expect([&] { gw::lt(c, g); }, "lt");
  expect([&] { gw::matmul(c, g.t()); }, "matmul");
  expect([&] { gw::where(gw::gt(c, 0), c, g); }, "where");
  expect([&] { gw::index_select(c, 0, g_index.select(0, 0)); }, "index_select");
  expect([&] { gw::gather(g, 1, c_index); }, "gather");
  expect([&] { gw::scatter_add(c, 1, g_index, c); }, "scatter_add");
  expect([&] { c.add_(g); }, "add");
  std::vector<uint8_t> host_mask(6, 1);
  gw::Tensor g_mask = gw::from_blob(host_mask.data(), {2, 3}, gw::kBool, {}, kGpu);
  expect([&] { c.masked_fill_(g_mask, 0); }, "masked_fill_");
}

TEST_CASE("round_size uses 512 B and 2 MiB granularity", "[cuda][allocator]") {
  using gw::cuda::round_size;
  CHECK(round_size(1) == 512);
  CHECK(round_size(512) == 512);
  CHECK(round_size(513) == 1024);
  CHECK(round_size((1 << 20) - 1) == (1 << 20));
  CHECK(round_size(1 << 20) == (2 << 20));
  CHECK(round_size((2 << 20) + 1) == (4 << 20));
}
TEST_CASE("the caching allocator hands a freed block out again", "[cuda][allocator]") {
  GW_REQUIRE_CUDA_DEVICE();
  gw::cuda::empty_cache();
  const auto base = gw::cuda::memory_stats(0);
  void* first = nullptr;
  {
    gw::Tensor a = gw::empty({1000}, kGpu);  // 4000 B: one 4096 B block
    first = a.raw_data();
    auto s = gw::cuda::memory_stats(0);
    CHECK(s.allocated_bytes == base.allocated_bytes + 4096);
    CHECK(s.reserved_bytes == base.reserved_bytes + 4096);
    CHECK(s.peak_allocated_bytes >= s.allocated_bytes);
    CHECK(s.num_driver_allocs == base.num_driver_allocs + 1);
  }
  auto freed = gw::cuda::memory_stats(0);
  CHECK(freed.allocated_bytes == base.allocated_bytes);
  CHECK(freed.reserved_bytes == base.reserved_bytes + 4096);  // cached, not returned

  gw::Tensor b = gw::empty({1010}, kGpu);  // rounds to the same bucket
  CHECK(b.raw_data() == first);
  auto reused = gw::cuda::memory_stats(0);
  CHECK(reused.num_cache_hits == freed.num_cache_hits + 1);
  CHECK(reused.num_driver_allocs == freed.num_driver_allocs);

  b = gw::Tensor();
  gw::cuda::empty_cache();
  auto emptied = gw::cuda::memory_stats(0);
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);

  // Big blocks round to 2 MiB.
  gw::Tensor big = gw::empty({(3 << 20) / 4}, kGpu);
  CHECK(gw::cuda::memory_stats(0).allocated_bytes == emptied.allocated_bytes + (4 << 20));
}

TEST_CASE("a destroyed stream's cached blocks go back to the driver", "[cuda][allocator]") {
  GW_REQUIRE_CUDA_DEVICE();
  gw::cuda::empty_cache();
  const auto base = gw::cuda::memory_stats(0);
  {
    gw::cuda::Stream side(0);
    gw::cuda::StreamGuard on(side);
    gw::Tensor t = gw::ones({1000}, kGpu);  // a 4096 B block kept for `side`'s handle
    t.mul_(2);
    t = gw::Tensor();
    CHECK(gw::cuda::memory_stats(0).reserved_bytes == base.reserved_bytes + 4096);
  }
  // A later stream may get the same handle: the block must not wait there for it.
  CHECK(gw::cuda::memory_stats(0).reserved_bytes == base.reserved_bytes);

  // A block that outlives its stream is cached for the default stream once freed.
  gw::Tensor kept;
  {
    gw::cuda::Stream side(0);
    gw::cuda::StreamGuard on(side);
    kept = gw::ones({1000}, kGpu);
  }
  void* block = kept.raw_data();
  kept = gw::Tensor();
  gw::Tensor again = gw::empty({1000}, kGpu);  // on the default stream
  CHECK(again.raw_data() == block);
}

TEST_CASE("pinned host memory is cached and usable as a CPU tensor", "[cuda][allocator]") {
  GW_REQUIRE_CUDA_DEVICE();
  gw::Tensor p = gw::cuda::empty_pinned({16}, gw::kFloat32);
  CHECK(p.device() == gw::kCPU);
  p.fill_(3.f);
  void* ptr = p.raw_data();
  p = gw::Tensor();
  gw::Tensor q = gw::cuda::empty_pinned({16}, gw::kFloat32);
  CHECK(q.raw_data() == ptr);
  q.fill_(2.f);
  cuda_test::expect_close(q, q.to(kGpu), "pinned upload");
  CHECK(gw::cuda::pinned_memory_stats().num_cache_hits >= 1);
}

TEST_CASE("streams, events and the current stream", "[cuda][stream]") {
  GW_REQUIRE_CUDA_DEVICE();
  CHECK(gw::cuda::current_stream(0) == cudaStreamLegacy);
  gw::cuda::Stream side(0);
  gw::Tensor x = gw::ones({1 << 16}, kGpu);
  gw::cuda::Event start, end;
  {
    gw::cuda::StreamGuard on(side);
    CHECK(gw::cuda::current_stream(0) == side.handle());
    start.record();
    x.mul_(2);
    end.record();
  }
  CHECK(gw::cuda::current_stream(0) == cudaStreamLegacy);
  end.synchronize();
  CHECK(end.query());
  CHECK(side.query());
  CHECK(start.elapsed_time(end) >= 0.f);
  side.synchronize();
  CHECK(x.sum().item<double>() == 2.0 * (1 << 16));
}

TEST_CASE("DeviceGuard restores the previous device", "[cuda][device]") {
  GW_REQUIRE_CUDA_DEVICE();
  const int before = gw::cuda::current_device();
  {
    gw::cuda::DeviceGuard guard(gw::cuda::device_count() - 1);
    CHECK(gw::cuda::current_device() == gw::cuda::device_count() - 1);
  }
  CHECK(gw::cuda::current_device() == before);
}

TEST_CASE("to(device) round trips every dtype and layout", "[cuda][copy]") {
  GW_REQUIRE_CUDA_DEVICE();
  gw::Generator gen(7);
  gw::Tensor base = gw::mul(gw::randn({5, 7}, gen), 10);
  for (gw::DType t : {gw::kFloat32, gw::kFloat64, gw::kInt64, gw::kInt32, gw::kBool, gw::kFloat16,
                      gw::kBFloat16}) {
    INFO(t);
    gw::Tensor host = base.to(t);
    gw::Tensor dev = host.to(kGpu);
    CHECK(dev.device() == kGpu);
    CHECK(dev.dtype() == t);
    gw::Tensor back = dev.to(gw::kCPU);
    CHECK(back.to(gw::kFloat64).to_vector<double>() == host.to(gw::kFloat64).to_vector<double>());
    // Strided on either side: a transposed upload and a download into a transposed view.
    gw::Tensor up_t = host.t().to(kGpu);
    CHECK(up_t.to(gw::kCPU).to(gw::kFloat64).to_vector<double>() ==
          host.t().contiguous().to(gw::kFloat64).to_vector<double>());
    gw::Tensor dst = gw::empty({7, 5}, t).t();
    dst.copy_(dev);
    CHECK(dst.to(gw::kFloat64).to_vector<double>() == host.to(gw::kFloat64).to_vector<double>());
  }
  // Converting copies across the boundary, and a broadcast source.
  gw::Tensor f = base.to(kGpu);
  gw::Tensor as_int = gw::empty({5, 7}, gw::kInt64);
  as_int.copy_(f);
  CHECK(as_int.to_vector<int64_t>() == base.to(gw::kInt64).to_vector<int64_t>());
  gw::Tensor row = gw::empty({3, 4}, gw::TensorOptions(gw::kFloat64).with_device(kGpu));
  row.copy_(gw::arange(4).to(gw::kFloat32));
  CHECK(row.to(gw::kCPU).to_vector<double>() ==
        std::vector<double>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  CHECK(gw::scalar_tensor(2.5).to(kGpu).item<double>() == 2.5);
}
