// Threads as ranks for the process group and DDP tests: run_ranks starts one Gloo group per
// rank over a shared HashStore. Catch2's assertions are not thread-safe, so the ranks record
// their checks in a Checks object (checks.h) and the test's thread asserts on them at the end.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <future>
#include <string>
#include <vector>

#include "dist/process_group/process_group_gloo.h"
#include "store/hash_store.h"
#include "tests/dist/process_group/checks.h"

namespace gw::dist::testing {

// Asserts, on the test's thread, that checks were made and all of them held (listing the
// failures otherwise).
inline void require_passed(const Checks& checks) {
  std::string failed;
  for (const auto& f : checks.failures) failed += f + "\n";
  INFO(failed);
  CHECK(checks.failures.empty());
  CHECK(checks.count > 0);
}

// Runs fn(pg, checks) on `n` ranks at once (threads, one HashStore), then asserts that every
// check held.
inline void run_ranks(int n, const std::function<void(ProcessGroupGloo&, Checks&)>& fn,
                      GlooOptions options = {}) {
  auto store = std::make_shared<gw::store::HashStore>();
  Checks checks;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      ProcessGroupGloo pg(store, r, n, options);
      fn(pg, checks);
    }));
  for (auto& f : ranks) f.get();
  require_passed(checks);
}

}  // namespace gw::dist::testing
