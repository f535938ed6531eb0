// The Store contract, run over every implementation (HashStore, FileStore, TCPStore,
// PrefixStore): the same calls must give the same answers.
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "core/error.h"
#include "tests/store/store_test_util.h"

using namespace gw::store;
using namespace gw::store::test;
using Catch::Matchers::Contains;

TEST_CASE("Store set and get round-trip bytes", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(10000));
  Store& s = t.store();

  const Bytes binary = {0, 1, 2, 255, 0, 7};
  s.set("bin", binary);
  s.set("empty", Bytes{});
  s.set("text", "hello");
  CHECK(s.get("bin") == binary);
  CHECK(s.get("empty").empty());
  CHECK(s.get_string("text") == "hello");

  s.set("text", "overwritten");
  CHECK(s.get_string("text") == "overwritten");
  CHECK(t.open_another()->get_string("text") == "overwritten");
}

TEST_CASE("Store add keeps a decimal counter", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(10000));
  Store& s = t.store();

  CHECK(s.add("n", 5) == 5);  // absent counts as 0
  CHECK(s.add("n", -7) == -2);
  CHECK(s.get_string("n") == "-2");
  CHECK(t.open_another()->add("n", 3) == 1);

  s.set("preset", "41");
  CHECK(s.add("preset", 1) == 42);

  s.set("words", "abc");
  CHECK_THROWS_WITH(s.add("words", 1), Contains("words") && Contains("abc"));
  CHECK_THROWS_AS(s.add("words", 1), gw::InvalidArgumentError);
  CHECK(s.get_string("words") == "abc");  // a failed add changes nothing
}

TEST_CASE("Store compare_set follows PyTorch semantics", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(10000));
  Store& s = t.store();

  SECTION("a missing key with a non-empty expected answers expected and sets nothing") {
    CHECK(s.compare_set("k", bytes("old"), bytes("new")) == bytes("old"));
    CHECK_FALSE(s.check({"k"}));
  }
  SECTION("a missing key with an empty expected is created") {
    CHECK(s.compare_set("k", Bytes{}, bytes("first")) == bytes("first"));
    CHECK(s.get_string("k") == "first");
  }
  SECTION("a matching expected swaps") {
    s.set("k", "a");
    CHECK(s.compare_set("k", bytes("a"), bytes("b")) == bytes("b"));
    CHECK(s.get_string("k") == "b");
  }
  SECTION("a mismatching expected answers the current value and leaves it") {
    s.set("k", "a");
    CHECK(s.compare_set("k", bytes("x"), bytes("b")) == bytes("a"));
    CHECK(s.get_string("k") == "a");
  }
}

TEST_CASE("Store check, delete_key and num_keys", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(10000));
  Store& s = t.store();

  CHECK(s.num_keys() == 0);
  CHECK(s.check({}));
  CHECK_FALSE(s.check({"a"}));
  s.set("a", "1");
  s.add("b", 1);
  CHECK(s.check({"a", "b"}));
  CHECK_FALSE(s.check({"a", "c"}));
  CHECK(s.num_keys() == 2);

  CHECK(s.delete_key("a"));
  CHECK_FALSE(s.delete_key("a"));
  CHECK_FALSE(s.check({"a"}));
  CHECK(s.num_keys() == 1);
  CHECK(t.open_another()->num_keys() == 1);
}

TEST_CASE("Store wait and get time out naming the missing keys", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(300));
  Store& s = t.store();
  s.set("present", "1");

  auto start = Clock::now();
  try {
    s.wait({"present", "absent"}, milliseconds(200));
    FAIL("wait returned although 'absent' was never set");
  } catch (const gw::TimeoutError& e) {
    CHECK_THAT(e.what(), Contains("(missing: " + t.shown_key("absent") + ")") &&
                             Contains(t.shown_key("present")));
  }
  auto waited = Clock::now() - start;
  CHECK(waited >= milliseconds(200));
  CHECK(waited < milliseconds(5000));

  start = Clock::now();
  CHECK_THROWS_AS(s.get("absent"), gw::TimeoutError);  // get uses the store's timeout
  CHECK(Clock::now() - start >= milliseconds(300));
  CHECK_THROWS_WITH(s.get("absent"), Contains("missing: " + t.shown_key("absent")));

  s.wait({"present"}, milliseconds(0));  // present keys never wait
}

TEST_CASE("Store waiters are woken by a set from another thread", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(30000));
  std::shared_ptr<Store> other = t.open_another();

  // Two waiters on the same object and one on another handle; none of the keys exists yet.
  std::string got_value;
  std::atomic<int> woken{0};
  ThreadGroup threads;
  threads.spawn([&] {
    got_value = t.store().get_string("k3");
    ++woken;
  });
  threads.spawn([&] {
    t.store().wait({"k1", "k2", "k3"});
    ++woken;
  });
  threads.spawn([&] {
    other->wait({"k3", "k1"});
    ++woken;
  });
  // Keys appear one at a time from yet another thread, so waiters see partial progress.
  threads.spawn([&] {
    for (const char* k : {"k1", "k2", "k3"}) other->set(k, std::string("value-") + k);
  });
  CHECK(threads.join().empty());
  CHECK(woken == 3);
  CHECK(got_value == "value-k3");
}

TEST_CASE("Store is safe to use from many threads", "[store]") {
  auto kind = GENERATE(from_range(kStoreKinds));
  INFO("store kind: " << kind);
  StoreUnderTest t(kind, milliseconds(30000));
  constexpr int kThreads = 4, kAdds = 25;

  ThreadGroup threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.spawn([&, i] {
      Store& s = t.store();
      for (int j = 0; j < kAdds; ++j) s.add("counter", 1);
      s.set("thread/" + std::to_string(i), std::to_string(i));
      // A barrier through the store itself: everyone waits for everyone.
      std::vector<std::string> all;
      for (int r = 0; r < kThreads; ++r) all.push_back("thread/" + std::to_string(r));
      s.wait(all);
    });
  }
  CHECK(threads.join().empty());
  CHECK(t.store().get_string("counter") == std::to_string(kThreads * kAdds));
  CHECK(t.store().num_keys() == kThreads + 1);
}
