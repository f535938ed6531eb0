// CPU parallelism (core/parallel.h): the thread-count setting, parallel_for's coverage and
// chunking, exception propagation, nesting and concurrent callers, and kernels giving identical
// results with 1 and 4 threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "tests/core/test_util.h"

using gw::Shape;
using gw::Tensor;

using core_test::ThreadsGuard;

namespace {

// Records every chunk parallel_for hands out (Catch assertions are not thread-safe, so the
// checks run afterwards on the calling thread).
struct Coverage {
  int64_t begin, end;
  std::vector<std::atomic<int>> hits;
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;

  Coverage(int64_t b, int64_t e) : begin(b), end(e), hits(static_cast<size_t>(std::max<int64_t>(e - b, 0))) {}

  void operator()(int64_t b, int64_t e) {
    {
      std::lock_guard lock(mu);
      chunks.emplace_back(b, e);
    }
    for (int64_t i = b; i < e; ++i) {
      if (i >= begin && i < end) hits[i - begin].fetch_add(1);
    }
  }

  bool each_once() const {
    for (const auto& h : hits)
      if (h.load() != 1) return false;
    return true;
  }
  bool chunks_in_range() const {
    for (const auto& [b, e] : chunks)
      if (b >= e || b < begin || e > end) return false;
    return true;
  }
};

// Deterministic float data in roughly [-4, 4].
Tensor data(Shape shape, int seed) {
  std::vector<float> v(static_cast<size_t>(gw::numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(std::sin(static_cast<double>(i) * 0.37 + seed) * 4.0);
  return gw::from_vector(v, shape);
}

}  // namespace

TEST_CASE("set_num_threads sets what get_num_threads reports", "[core][parallel]") {
  ThreadsGuard guard;
  for (int n : {1, 2, 4, 3, 8, 1}) {
    gw::set_num_threads(n);
    CHECK(gw::get_num_threads() == n);
  }
}

TEST_CASE("parallel_for covers the range exactly once", "[core][parallel]") {
  ThreadsGuard guard;
  const std::vector<std::pair<int64_t, int64_t>> ranges{
      {0, 1000}, {5, 1003}, {0, 1}, {-50, 50}, {0, 100000}};
  for (int threads : {1, 2, 3, 4, 8}) {
    gw::set_num_threads(threads);
    for (const auto& [begin, end] : ranges) {
      for (int64_t grain : {1, 7, 100, 5000}) {
        CAPTURE(threads, begin, end, grain);
        Coverage cov(begin, end);
        gw::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { cov(b, e); });
        CHECK(cov.each_once());
        CHECK(cov.chunks_in_range());
        CHECK(static_cast<int>(cov.chunks.size()) <= threads);
        // Chunks hold at least `grain` elements, except the one that ends the range.
        for (const auto& [b, e] : cov.chunks)
          if (e != end) CHECK(e - b >= grain);
        if (threads == 1 || end - begin <= grain) CHECK(cov.chunks.size() == 1);
        if (threads >= 2 && end - begin >= 2 * grain) CHECK(cov.chunks.size() >= 2);
      }
    }
  }
}

TEST_CASE("parallel_for does nothing for an empty range", "[core][parallel]") {
  ThreadsGuard guard;
  gw::set_num_threads(4);
  std::atomic<int> calls{0};
  gw::parallel_for(10, 10, 1, [&](int64_t, int64_t) { ++calls; });
  gw::parallel_for(10, 3, 1, [&](int64_t, int64_t) { ++calls; });
  CHECK(calls.load() == 0);
}

TEST_CASE("exceptions in parallel_for reach the caller", "[core][parallel]") {
  ThreadsGuard guard;
  gw::set_num_threads(4);
  auto throw_at = [](int64_t where) {
    return [where](int64_t b, int64_t e) {
      if (b <= where && where < e) throw std::runtime_error("chunk failed at " + std::to_string(where));
    };
  };
  SECTION("from a worker's chunk") {
    CHECK_THROWS_WITH(gw::parallel_for(0, 1000, 1, throw_at(999)), "chunk failed at 999");
  }
  SECTION("from the caller's own chunk") {
    CHECK_THROWS_WITH(gw::parallel_for(0, 1000, 1, throw_at(0)), "chunk failed at 0");
  }
  SECTION("from every chunk: one of them, keeping its type") {
    CHECK_THROWS_AS(gw::parallel_for(0, 1000, 1, [](int64_t, int64_t) { throw gw::ShapeError("x"); }),
                    gw::ShapeError);
  }
  SECTION("on a single thread") {
    gw::set_num_threads(1);
    CHECK_THROWS_WITH(gw::parallel_for(0, 10, 1, throw_at(5)), "chunk failed at 5");
  }
  // The pool keeps working after a failure.
  Coverage cov(0, 5000);
  gw::parallel_for(0, 5000, 1, [&](int64_t b, int64_t e) { cov(b, e); });
  CHECK(cov.each_once());
}

TEST_CASE("nested and concurrent parallel_for calls complete", "[core][parallel]") {
  ThreadsGuard guard;
  gw::set_num_threads(4);
  SECTION("nested: the inner call still covers its range") {
    std::vector<std::atomic<int>> hits(64 * 100);
    gw::parallel_for(0, 64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        gw::parallel_for(0, 100, 1, [&](int64_t ib, int64_t ie) {
          for (int64_t j = ib; j < ie; ++j) hits[i * 100 + j].fetch_add(1);
        });
      }
    });
    bool once = true;
    for (const auto& h : hits) once &= h.load() == 1;
    CHECK(once);
  }
  SECTION("two threads calling at once") {
    Coverage a(0, 200000), b(0, 300000);
    std::thread t1([&] {
      for (int r = 0; r < 5; ++r) {
        Coverage c(0, 200000);
        gw::parallel_for(0, 200000, 100, [&](int64_t x, int64_t y) { c(x, y); });
        if (r == 4) gw::parallel_for(0, 200000, 100, [&](int64_t x, int64_t y) { a(x, y); });
      }
    });
    std::thread t2([&] {
      for (int r = 0; r < 5; ++r) {
        Coverage c(0, 300000);
        gw::parallel_for(0, 300000, 100, [&](int64_t x, int64_t y) { c(x, y); });
        if (r == 4) gw::parallel_for(0, 300000, 100, [&](int64_t x, int64_t y) { b(x, y); });
      }
    });
    t1.join();
    t2.join();
    CHECK(a.each_once());
    CHECK(b.each_once());
  }
}

TEST_CASE("kernels give identical results with 1 and 4 threads", "[core][parallel]") {
  ThreadsGuard guard;
  const Tensor x = data({1024, 1024}, 1), y = data({1024}, 2), z = data({1024, 1024}, 3);
  const Tensor x64 = x.to(gw::kFloat64);
  auto run = [&] {
    std::vector<Tensor> out;
    out.push_back(gw::exp(x));
    out.push_back(x + y);                          // broadcast row
    out.push_back(x.t() * z);                      // transposed operand
    out.push_back(gw::sigmoid(x.slice(1, 0, 1024, 3)));  // stepped
    out.push_back(gw::maximum(x, y.unsqueeze(1)));  // broadcast column
    out.push_back(gw::where(gw::gt(x, z), x, z.t()));
    out.push_back(gw::clamp(x.t(), -1.0, 2.0));
    out.push_back(gw::lt(x, 0.5));
    out.push_back(x.t().contiguous());
    out.push_back(x.t().to(gw::kFloat64));
    out.push_back(gw::tanh(x64.t()));
    out.push_back(gw::softmax(x, 1));
    out.push_back(gw::softmax(x, 0));
    out.push_back(gw::log_softmax(x.t(), -1));
    out.push_back(gw::softmax(x64.view({64, 16, 1024}), 1));
    out.push_back(gw::sum(x, {1}));
    out.push_back(gw::amax(x.t(), {0}));
    Tensor acc = z.clone();
    acc.add_(x.t(), 0.5);
    acc.mul_(y);
    out.push_back(acc);
    return out;
  };
  gw::set_num_threads(1);
  std::vector<Tensor> one = run();
  gw::set_num_threads(4);
  std::vector<Tensor> four = run();
  REQUIRE(one.size() == four.size());
  for (size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(one[i].sizes() == four[i].sizes());
    CHECK(gw::equal(one[i], four[i]));
  }
  // And the multi-threaded results are right, not just repeatable (spot checks).
  std::vector<float> xv = x.to_vector<float>(), e = four[0].to_vector<float>();
  for (size_t i = 0; i < xv.size(); i += 4099) CHECK(e[i] == Approx(std::exp(xv[i])));
  std::vector<float> rows = gw::sum(four[11], {1}).to_vector<float>();
  for (float s : rows) CHECK(s == Approx(1.f).epsilon(1e-5));
}
