// The default process group between real processes over 127.0.0.1.
#include <catch2/catch.hpp>

#include <chrono>

#include "core/ops.h"
#include "dist/process_group/init.h"
#include "dist/store/tcp_store.h"
#include "tests/process_util.h"

using namespace gw;
using namespace std::chrono_literals;

namespace {
// `world_size - 1` pg_peer processes running `scenario`, and this process as rank 0.
struct Group {
  std::shared_ptr<dist::TCPStore> store =
      std::make_shared<dist::TCPStore>("127.0.0.1", 0, -1, true, std::chrono::seconds(60));
  test::PeerProcesses peers;
  Group(int world_size, const std::string& scenario)
      : peers(GW_PG_PEER, world_size, store->port(), {scenario}) {
    dist::init_process_group("gloo", store, 0, world_size);
  }
  std::vector<int> wait() { return peers.wait(); }
  ~Group() { dist::destroy_process_group(); }
};
}  // namespace

TEST_CASE("three processes: allreduce in the default group and in a subgroup",
          "[process_group][process]") {
  Group g(3, "collectives");
  auto pg = dist::default_process_group();
  CHECK(pg->rank() == 0);
  CHECK(pg->size() == 3);
  Tensor t = ones({4});
  pg->allreduce(t)->wait();
  CHECK(allclose(t, full({4}, 6.0)));  // 1 + 2 + 3
  CHECK_THROWS_WITH(dist::new_group({}), Catch::Contains("no ranks"));
  CHECK_THROWS_WITH(dist::new_group({1, 1}), Catch::Contains("rank 1 is listed twice"));
  CHECK_THROWS_WITH(dist::new_group({0, 3}), Catch::Contains("rank 3 is outside [0, 3)"));
  auto pair = dist::new_group({0, 1});
  REQUIRE(pair);
  CHECK(pair->size() == 2);
  Tensor u = ones({2});
  pair->allreduce(u)->wait();
  CHECK(allclose(u, full({2}, 3.0)));
  pg->barrier()->wait();
  CHECK(g.wait() == std::vector<int>{0, 0});  // each peer checked its own results
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
  CHECK_THROWS_WITH(dist::init_process_group("mpi", "env://", 0, 1),
                    Catch::Contains("backend 'mpi' is not available"));
}
