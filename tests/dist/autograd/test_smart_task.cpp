// SMART mode's gated backward task (dist/autograd/smart_task.h) on one worker, driven by hand:
// which nodes it holds, when it lets them go, and which boundary nodes it reports.
#include <catch2/catch.hpp>

#include "dist/autograd/smart_task.h"
#include "tests/autograd/engine_test_util.h"

using namespace engine_test;
using gw::dist::autograd::SmartTask;

TEST_CASE("SMART mode: a node an unmarked candidate reaches is held until marked or closed",
          "[dist_autograd][smart]") {
  // Two sends share x; only send1's gradient arrives at first. x's accumulation has what the
  // marked candidates owe it, but send2 may still be on the path: it is held.
  Tensor x = leaf({1.0, 2.0});
  Tensor s1 = x * 2.0, s2 = x * x;
  auto send1 = std::make_shared<FakeSendBackward>(s1);
  auto send2 = std::make_shared<FakeSendBackward>(s2);
  ag::ExecuteOptions options;
  options.extra_roots = {send1, send2};
  auto boundary = [&](const ag::Node& n) { return &n == ag::gradient_edge(x).fn.get(); };
  SmartTask task(nullptr, options, boundary);
  CHECK(task.open_nodes() == 0);  // nothing counts before a candidate is marked
  task.add_gradients(send1, {constant({1.0, 1.0})});
  // x's node was first reached from send1 while send2 was undecided: not certain to run.
  CHECK(task.take_uncertain().size() == 1);
  task.run();
  CHECK(send1->calls == 1);
  CHECK_FALSE(x.grad().defined());
  CHECK(task.open_nodes() == 1);

  SECTION("closed: send2 is off the path, x runs with send1's gradient alone") {
    task.close();
    task.run();
    CHECK(vec(x.grad()) == std::vector<double>{2.0, 2.0});
    CHECK(task.finished());
    CHECK_THROWS_AS(task.mark(send2), gw::StateError);
  }
  SECTION("marked: x waits for send2's gradient too") {
    task.mark(send2);
    task.run();
    CHECK_FALSE(x.grad().defined());
    task.add_gradients(send2, {constant({5.0, 7.0})});
    task.run();
    CHECK(vec(x.grad()) == std::vector<double>{12.0, 30.0});  // 2 + 2x * [5, 7]
    CHECK(task.finished());
  }
}

TEST_CASE("SMART mode: a node reached from more than four candidates waits for all to be decided",
          "[dist_autograd][smart]") {
  // x is reached from six sends, so its reach is "many": it waits for every candidate of the
  // task, the seventh (y's, which does not reach it) included. A recv-like boundary below x is
  // never certain while a candidate has no gradient.
  Tensor x = leaf({1.0}), y = leaf({1.0});
  Tensor from_x = x * 1.0;  // its node is the boundary
  std::vector<Tensor> sent;
  std::vector<std::shared_ptr<FakeSendBackward>> sends;
  ag::ExecuteOptions options;
  for (int k = 1; k <= 6; ++k) {
    sent.push_back(from_x * double(k));
    sends.push_back(std::make_shared<FakeSendBackward>(sent.back()));
    options.extra_roots.push_back(sends.back());
  }
  Tensor from_y = y * 2.0;
  auto unrelated = std::make_shared<FakeSendBackward>(from_y);
  options.extra_roots.push_back(unrelated);
  auto boundary = [&](const ag::Node& n) { return &n == from_x.grad_fn().get(); };
  SmartTask task(nullptr, options, boundary);
  for (int k = 0; k < 6; ++k) task.add_gradients(sends[k], {constant({1.0})});
  CHECK(task.take_uncertain().size() == 1);  // "many" and y's send has no gradient
  task.run();
  CHECK_FALSE(x.grad().defined());  // held: y's send is undecided
  CHECK_THROWS_AS(task.add_gradient(unrelated, 0, constant({1.0})), gw::InvalidArgumentError);
  SECTION("closed") {
    task.close();
    task.run();
    CHECK(vec(x.grad()) == std::vector<double>{21.0});  // 1 + 2 + ... + 6
    CHECK_FALSE(y.grad().defined());
  }
  SECTION("delivered") {
    task.add_gradients(unrelated, {constant({1.0})});
    task.run();
    CHECK(vec(x.grad()) == std::vector<double>{21.0});
    CHECK(vec(y.grad()) == std::vector<double>{2.0});
  }
  CHECK(task.finished());
}
