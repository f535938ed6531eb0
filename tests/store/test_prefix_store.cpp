// PrefixStore: keys live under "prefix/" in the underlying store and stay isolated.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "tests/store/store_test_util.h"

using namespace gw::store;
using namespace gw::store::test;
using Catch::Matchers::Contains;

TEST_CASE("PrefixStore puts keys under prefix/", "[store][prefix]") {
  auto base = std::make_shared<HashStore>(milliseconds(5000));
  PrefixStore pg("pg0", base);
  pg.set("ready", "1");
  pg.add("count", 2);
  CHECK(base->get_string("pg0/ready") == "1");
  CHECK(base->get_string("pg0/count") == "2");
  CHECK_FALSE(base->check({"ready"}));
  CHECK(pg.check({"ready", "count"}));
  CHECK(pg.delete_key("ready"));
  CHECK_FALSE(base->check({"pg0/ready"}));

  PrefixStore nested("sub", std::make_shared<PrefixStore>("pg0", base));
  nested.set("k", "v");
  CHECK(base->get_string("pg0/sub/k") == "v");
}

TEST_CASE("PrefixStores over one store are isolated", "[store][prefix]") {
  auto base = std::make_shared<HashStore>(milliseconds(5000));
  PrefixStore a("a", base), b("b", base);
  a.set("key", "from a");
  b.set("key", "from b");
  CHECK(a.get_string("key") == "from a");
  CHECK(b.get_string("key") == "from b");
  CHECK(a.add("n", 1) == 1);
  CHECK(b.add("n", 10) == 10);
  CHECK_FALSE(b.check({"only_a"}));
  a.set("only_a", "x");
  CHECK_FALSE(b.check({"only_a"}));
  CHECK(a.compare_set("key", bytes("from a"), bytes("swapped")) == bytes("swapped"));
  CHECK(b.get_string("key") == "from b");

  // A wait in one namespace is not satisfied by the same key in another, and says which key.
  CHECK_THROWS_WITH(b.wait({"only_a"}, milliseconds(50)), Contains("b/only_a"));
}

TEST_CASE("PrefixStore uses its own timeout and rejects a null store", "[store][prefix]") {
  auto base = std::make_shared<HashStore>(milliseconds(60000));
  PrefixStore p("p", base);
  CHECK(p.timeout() == milliseconds(60000));
  p.set_timeout(milliseconds(100));
  auto start = Clock::now();
  CHECK_THROWS_AS(p.get("missing"), gw::TimeoutError);
  CHECK(Clock::now() - start < milliseconds(5000));

  CHECK_THROWS_AS(PrefixStore("p", nullptr), gw::InvalidArgumentError);
}
