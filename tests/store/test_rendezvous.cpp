// rendezvous(): URL parsing, the stores it builds, and its errors.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "store/file_store.h"
#include "store/rendezvous.h"
#include "store/tcp_store.h"
#include "tests/scoped_env.h"
#include "tests/store/store_test_util.h"

using namespace gw::store;
using namespace gw::store::test;
using Catch::Matchers::Contains;

namespace {

using gw::test::ScopedEnv;

const milliseconds kTimeout(5000);

}  // namespace

TEST_CASE("rendezvous tcp:// makes rank 0 the master", "[store][rendezvous]") {
  auto s0 = rendezvous("tcp://127.0.0.1:0", 0, 2, kTimeout);
  auto* master = dynamic_cast<TCPStore*>(s0.get());
  REQUIRE(master != nullptr);
  CHECK(master->is_master());
  CHECK(master->timeout() == kTimeout);
  const std::string port = std::to_string(master->port());

  auto s1 = rendezvous("tcp://127.0.0.1:" + port, 1, 2, kTimeout);
  CHECK_FALSE(dynamic_cast<TCPStore&>(*s1).is_master());
  s1->set("from", "rank 1");
  CHECK(s0->get_string("from") == "rank 1");
}

TEST_CASE("rendezvous env:// reads MASTER_ADDR and MASTER_PORT", "[store][rendezvous]") {
  auto s0 = rendezvous("tcp://127.0.0.1:0", 0, 2, kTimeout);
  const std::string port = std::to_string(dynamic_cast<TCPStore&>(*s0).port());

  SECTION("both set") {
    ScopedEnv addr("MASTER_ADDR", "127.0.0.1"), p("MASTER_PORT", port);
    auto s1 = rendezvous("env://", 1, 2, kTimeout);
    CHECK(dynamic_cast<TCPStore&>(*s1).port() == dynamic_cast<TCPStore&>(*s0).port());
    s1->set("k", "v");
    CHECK(s0->get_string("k") == "v");
  }
  SECTION("MASTER_ADDR missing") {
    ScopedEnv addr("MASTER_ADDR", std::nullopt), p("MASTER_PORT", port);
    CHECK_THROWS_AS(rendezvous("env://", 1, 2, kTimeout), gw::InvalidArgumentError);
    CHECK_THROWS_WITH(rendezvous("env://", 1, 2, kTimeout), Contains("MASTER_ADDR"));
  }
  SECTION("MASTER_PORT missing") {
    ScopedEnv addr("MASTER_ADDR", "127.0.0.1"), p("MASTER_PORT", std::nullopt);
    CHECK_THROWS_WITH(rendezvous("env://", 1, 2, kTimeout), Contains("MASTER_PORT"));
  }
  SECTION("MASTER_PORT not a port") {
    ScopedEnv addr("MASTER_ADDR", "127.0.0.1");
    for (const char* bad : {"abc", "70000", "-1", "29500x", ""}) {
      ScopedEnv p("MASTER_PORT", bad);
      INFO("MASTER_PORT=" << bad);
      CHECK_THROWS_AS(rendezvous("env://", 1, 2, kTimeout), gw::InvalidArgumentError);
      CHECK_THROWS_WITH(rendezvous("env://", 1, 2, kTimeout), Contains("MASTER_PORT"));
    }
  }
}

TEST_CASE("rendezvous file:// shares a FileStore", "[store][rendezvous]") {
  TempDir dir;
  const std::string url = "file://" + dir.path() + "/rdzv";
  auto s0 = rendezvous(url, 0, 2, kTimeout);
  auto s1 = rendezvous(url, 1, 2, kTimeout);
  REQUIRE(dynamic_cast<FileStore*>(s1.get()) != nullptr);
  CHECK(dynamic_cast<FileStore&>(*s1).path() == dir.path() + "/rdzv");
  s0->add("arrived", 1);
  CHECK(s1->add("arrived", 1) == 2);

  CHECK_THROWS_WITH(rendezvous("file://" + dir.path() + "/no/such/dir/f", 0, 1, kTimeout),
                    Contains(dir.path() + "/no/such/dir/f") && Contains("No such file"));
}

TEST_CASE("rendezvous rejects bad URLs and ranks naming the value", "[store][rendezvous]") {
  struct Case {
    std::string url;
    int rank, world_size;
    std::string mentions;
  };
  auto c = GENERATE(values<Case>({
      {"127.0.0.1:29500", 0, 1, "'127.0.0.1:29500' is not a URL"},
      {"udp://127.0.0.1:29500", 0, 1, "unknown scheme 'udp'"},
      {"tcp://127.0.0.1", 0, 1, "has no port"},
      {"tcp://:29500", 0, 1, "empty host"},
      {"tcp://127.0.0.1:29x", 0, 1, "port '29x'"},
      {"tcp://127.0.0.1:65536", 0, 1, "port '65536'"},
      {"tcp://127.0.0.1:0", 1, 2, "port 0"},
      {"file://relative/path", 0, 1, "absolute path"},
      {"file://", 0, 1, "absolute path"},
      {"env://somewhere", 0, 1, "env:// takes no address"},
      {"tcp://127.0.0.1:0", -1, 2, "rank -1"},
      {"tcp://127.0.0.1:0", 2, 2, "rank 2 is outside [0, 2)"},
      {"tcp://127.0.0.1:0", 0, 0, "world_size 0"},
  }));
  INFO("init_method " << c.url << " rank " << c.rank << " world_size " << c.world_size);
  CHECK_THROWS_AS(rendezvous(c.url, c.rank, c.world_size, kTimeout), gw::InvalidArgumentError);
  CHECK_THROWS_WITH(rendezvous(c.url, c.rank, c.world_size, kTimeout), Contains(c.mentions));
}
