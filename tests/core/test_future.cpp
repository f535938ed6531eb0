#include <catch2/catch.hpp>

#include <thread>

#include "core/future.h"

using namespace gw;
using namespace std::chrono_literals;

TEST_CASE("Future completes once with a value or an error", "[future]") {
  Future<int> f;
  CHECK_FALSE(f.done());
  CHECK_THROWS_AS(f.value(), StateError);
  CHECK_THROWS_AS(f.wait(10ms), TimeoutError);
  f.set_result(7);
  CHECK(f.done());
  CHECK(f.wait() == 7);
  CHECK(f.value() == 7);
  CHECK_THROWS_AS(f.set_result(8), StateError);

  Future<int> e;
  e.set_exception(std::make_exception_ptr(IoError("lost")));
  CHECK(e.has_error());
  CHECK_THROWS_WITH(e.wait(), "lost");
}

TEST_CASE("Future wakes a waiter on another thread", "[future]") {
  Future<std::string> f;
  std::thread t([f]() mutable { f.set_result("hello"); });
  CHECK(f.wait(10s) == "hello");
  t.join();
}

TEST_CASE("a thread that may not wait gets StateError instead of blocking", "[future]") {
  Future<int> pending;
  Future<int> done = Future<int>::ready(3);
  {
    NoWaiting scope("it reads the frames");
    CHECK(done.wait() == 3);  // nothing to wait for
    // (Bounded waits: without the scope they end in TimeoutError, not a hang.)
    CHECK_THROWS_AS(pending.wait(100ms), StateError);
    CHECK_THROWS_WITH(pending.wait(100ms), Catch::Contains("may not wait: it reads the frames"));
    {
      NoWaiting inner("inner");
      CHECK_THROWS_WITH(pending.wait(100ms), Catch::Contains("inner"));
    }
    CHECK_THROWS_WITH(pending.wait(100ms), Catch::Contains("it reads the frames"));  // restored
  }
  CHECK(NoWaiting::why() == nullptr);
  CHECK_THROWS_AS(pending.wait(10ms), TimeoutError);  // waits again
}

TEST_CASE("then chains continuations, flattens futures and carries errors", "[future]") {
  Future<int> f;
  auto plus_one = f.then([](Future<int>& x) { return x.wait() + 1; });
  Future<int> inner;
  auto flattened = f.then([inner](Future<int>&) { return inner; });
  auto failing = f.then([](Future<int>&) -> int { throw IndexError("bad"); });
  Future<void> v;
  auto after_void = v.then([](Future<void>& x) {
    x.wait();
    return 5;
  });
  CHECK_FALSE(plus_one.done());
  f.set_result(1);
  CHECK(plus_one.value() == 2);
  CHECK_FALSE(flattened.done());  // follows `inner`, not `f`
  inner.set_result(9);
  CHECK(flattened.value() == 9);
  CHECK_THROWS_AS(failing.value(), IndexError);
  v.set_result();
  CHECK(after_void.value() == 5);
  // A callback added after completion runs at once.
  int seen = 0;
  f.add_done_callback([&](Future<int>& x) { seen = x.value(); });
  CHECK(seen == 1);
}

TEST_CASE("collect_all and wait_all", "[future]") {
  std::vector<Future<int>> fs(3);
  auto all = collect_all(fs);
  fs[1].set_result(1);
  fs[0].set_result(0);
  CHECK_FALSE(all.done());
  fs[2].set_exception(std::make_exception_ptr(IoError("x")));
  REQUIRE(all.done());
  CHECK(all.value()[1].value() == 1);
  CHECK(all.value()[2].has_error());
  CHECK_THROWS_AS(wait_all(fs), IoError);
  CHECK(collect_all(std::vector<Future<int>>{}).done());
  std::vector<Future<int>> ok{Future<int>::ready(4), Future<int>::ready(5)};
  CHECK(wait_all(ok) == std::vector<int>{4, 5});
}
