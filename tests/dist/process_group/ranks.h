// Threads as ranks for the process group and DDP tests: run_ranks starts one Gloo group per
// rank over a shared HashStore. Catch2's assertions are not thread-safe, so the ranks record
// their checks in a Checks object and the test's thread asserts on them at the end.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "dist/process_group/process_group_gloo.h"
#include "dist/store/hash_store.h"

namespace gw::dist::testing {

struct Checks {
  std::mutex mu;
  int count = 0;
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    std::lock_guard lock(mu);
    ++count;
    if (!ok) failures.push_back(what);
  }
  // f() must throw E whose message contains every needle.
  template <typename E = std::exception>
  void expect_throws(const std::function<void()>& f, std::vector<std::string> needles,
                     const std::string& what) {
    try {
      f();
    } catch (const std::exception& e) {
      bool ok = dynamic_cast<const E*>(&e) != nullptr;
      for (const auto& n : needles) ok = ok && std::string(e.what()).find(n) != std::string::npos;
      return expect(ok, what + ": threw " + e.what());
    }
    expect(false, what + ": did not throw");
  }
};
#define EXPECT(c, cond) (c).expect((cond), #cond " (line " + std::to_string(__LINE__) + ")")
#define EXPECT_THROWS(c, E, expr, ...)                  \
  (c).expect_throws<E>([&] { expr; }, {__VA_ARGS__}, \
                       #expr " (line " + std::to_string(__LINE__) + ")")

// Runs fn(pg, checks) on `n` ranks at once (threads, one HashStore), then asserts that every
// check held.
inline void run_ranks(int n, const std::function<void(ProcessGroupGloo&, Checks&)>& fn,
                      GlooOptions options = {}) {
  auto store = std::make_shared<HashStore>();
  Checks checks;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      ProcessGroupGloo pg(store, r, n, options);
      fn(pg, checks);
    }));
  for (auto& f : ranks) f.get();
  std::string failed;
  for (const auto& f : checks.failures) failed += f + "\n";
  INFO(failed);
  CHECK(checks.failures.empty());
  CHECK(checks.count > 0);
}

}  // namespace gw::dist::testing
