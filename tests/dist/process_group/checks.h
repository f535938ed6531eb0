// Checks recorded by ranks that run as threads or processes, asserted by whoever owns the test
// (Catch2's assertions are neither thread-safe nor available in a peer process).
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

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

}  // namespace gw::dist::testing
