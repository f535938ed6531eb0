// The default process group between real processes over 127.0.0.1.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <thread>

#include "core/ops.h"
#include "dist/process_group/init_process_group.h"
#include "store/tcp_store.h"
#include "tests/dist/process_group/collective_checks.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/process_util.h"
#include "tests/scoped_env.h"

using namespace gw;
using namespace std::chrono_literals;

namespace {
// `world_size - 1` pg_peer processes running `scenario`, and this process as rank 0.
struct Group {
  std::shared_ptr<store::TCPStore> store =
      std::make_shared<gw::store::TCPStore>("127.0.0.1", 0, -1, true, std::chrono::seconds(60));
  test::PeerProcesses peers;
  Group(int world_size, const std::string& scenario)
      : peers(GW_PG_PEER, world_size, store->port(), {scenario}) {
    dist::init_process_group("gloo", store, 0, world_size);
  }
  std::vector<int> wait() { return peers.wait(); }
  ~Group() { dist::destroy_process_group(); }
};
}  // namespace

TEST_CASE("every collective between processes at world sizes 1 to 4, and a subgroup",
          "[process_group][process]") {
  for (int world = 1; world <= 4; ++world) {
    INFO("world " << world);
    Group g(world, "collectives");
    auto pg = dist::default_process_group();
    CHECK(pg->rank() == 0);
    CHECK(pg->size() == world);
    dist::testing::Checks checks;
    dist::testing::check_every_collective(*pg, checks);
    dist::testing::require_passed(checks);
    if (world >= 2) {  // a group the other ranks are not in; every rank must make it
      auto pair = dist::new_group({0, 1});
      REQUIRE(pair);
      CHECK(pair->size() == 2);
      Tensor u = ones({2});
      pair->allreduce(u)->wait();
      CHECK(allclose(u, full({2}, 3.0)));
    }
    pg->barrier()->wait();
    CHECK(g.wait() == std::vector<int>(world - 1, 0));  // each peer checked its own results
  }
}

TEST_CASE("new_group rejects bad rank lists", "[process_group][process]") {
  Group g(1, "collectives");
  CHECK_THROWS_WITH(dist::new_group({}), Catch::Contains("no ranks"));
  CHECK_THROWS_WITH(dist::new_group({0, 0}), Catch::Contains("rank 0 is listed twice"));
  CHECK_THROWS_WITH(dist::new_group({0, 1}), Catch::Contains("rank 1 is outside [0, 1)"));
}

TEST_CASE("a rank that dies fails the collective on the others at once",
          "[process_group][process]") {
  Group g(2, "die");
  dist::default_process_group()->barrier()->wait();  // the peer dies after this barrier
  CHECK(g.wait() == std::vector<int>{3});
  Tensor t = ones({4});
  auto started = std::chrono::steady_clock::now();
  // The group's timeout is 30 minutes: the error must come from the lost connection.
  CHECK_THROWS_AS(dist::default_process_group()->allreduce(t)->wait(), IoError);
  CHECK(std::chrono::steady_clock::now() - started < 30s);
  CHECK_THROWS_WITH(dist::init_process_group("gloo", g.store, 0, 2),
                    Catch::Contains("exists already"));
  CHECK_THROWS_WITH(dist::init_process_group("ucc", "env://", 0, 1),
                    Catch::Contains("backend 'ucc' is not available"));
}

// Liveness (dist/process_group/group_liveness.h): GW_FAILURE_TIMEOUT reaches the peer and this
// rank.
TEST_CASE("a stopped rank is declared dead and fails the collective within failure_timeout",
          "[process_group][process][liveness]") {
  test::ScopedEnv window(store::kFailureTimeoutEnv, "1");
  Group g(3, "idle");
  auto pg = dist::default_process_group();
  pg->barrier()->wait();
  REQUIRE(::kill(g.peers.pids()[0], SIGSTOP) == 0);  // rank 1, before its allreduce
  Tensor t = ones({4});
  const auto stopped = std::chrono::steady_clock::now();
  // The group's timeout is 30 minutes: the error must come from the heartbeat. (Rank 1 may
  // have sent its whole part of the allreduce before it stopped; it cannot have entered the
  // barrier, which needs the allreduce done on every rank.)
  std::string error = "(no error)";
  try {
    pg->allreduce(t)->wait();
    pg->barrier()->wait();
  } catch (const IoError& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("rank 1 declared dead") && Catch::Contains("no heartbeat"));
  const auto took = std::chrono::steady_clock::now() - stopped;
  INFO("failed after " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < 30s);
  // The group is unusable from now on, at once.
  CHECK_THROWS_WITH(pg->barrier()->wait(), Catch::Contains("unusable"));
  CHECK_THROWS_WITH(pg->allreduce(t)->wait(), Catch::Contains("unusable"));
  ::kill(g.peers.pids()[0], SIGKILL);
  // Rank 2 learned it through the store and failed too (its allreduce would otherwise wait
  // for 30 minutes).
  CHECK(g.wait() == std::vector<int>{128 + SIGKILL, 1});
}

TEST_CASE("a rank busy computing, or stopped for less than failure_timeout, is not declared dead",
          "[process_group][process][liveness]") {
  test::ScopedEnv window(store::kFailureTimeoutEnv, "2");
  const bool busy = GENERATE(true, false);
  Group g(2, busy ? "busy" : "idle");
  auto pg = dist::default_process_group();
  pg->barrier()->wait();
  if (!busy) {
    REQUIRE(::kill(g.peers.pids()[0], SIGSTOP) == 0);
    std::this_thread::sleep_for(500ms);  // how long it stays stopped (not a synchronisation)
    REQUIRE(::kill(g.peers.pids()[0], SIGCONT) == 0);
  }
  Tensor t = ones({4});
  pg->allreduce(t)->wait();  // the busy peer joins after 6 s, three windows
  CHECK(allclose(t, full({4}, 2.0)));
  pg->barrier()->wait();
  CHECK(g.wait() == std::vector<int>{0});
}
