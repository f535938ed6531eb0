// Concurrency and the GraphTask API that distributed autograd drives: concurrent backward
// passes, an extra root fed from another thread, a leaf sink.
#include <catch2/catch.hpp>

#include <atomic>
#include <barrier>
#include <latch>
#include <map>
#include <thread>

#include "tests/autograd/engine_test_util.h"

using namespace engine_test;

// --- threads ------------------------------------------------------------------------------------

TEST_CASE("concurrent backward over independent graphs on two threads",
          "[autograd][engine][threads]") {
  // y = sum(tanh(W v)): dW[i][j] = (1 - tanh(s_i)^2) v_j with s = W v, computed in plain C++.
  const std::vector<std::vector<double>> w_values = {
      {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 0.05, -0.15, 0.25},
      {-0.3, 0.2, 0.1, 0.6, 0.5, -0.4, 0.2, 0.8, -0.9, 0.35, 0.45, -0.05}};
  const std::vector<std::vector<double>> v_values = {{1.0, -2.0, 0.5, 1.5}, {0.3, 0.7, -1.1, 2.0}};
  std::vector<std::vector<double>> expected(2);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 3; ++i) {
      double s = 0;
      for (int j = 0; j < 4; ++j) s += w_values[t][i * 4 + j] * v_values[t][j];
      double d = 1 - std::tanh(s) * std::tanh(s);
      for (int j = 0; j < 4; ++j) expected[t].push_back(d * v_values[t][j]);
    }
  }
  constexpr int kIterations = 200;
  std::vector<int> mismatches(2, 0), errors(2, 0);
  std::latch start(2);
  auto worker = [&](int t) {
    start.arrive_and_wait();
    for (int it = 0; it < kIterations; ++it) {
      try {
        Tensor w = leaf(w_values[t], {3, 4});
        Tensor v = constant(v_values[t]);
        gw::tanh(gw::matmul(w, v)).sum().backward();
        if (!near(vec(w.grad()), expected[t], 1e-10)) ++mismatches[t];
      } catch (...) {
        ++errors[t];
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  CHECK(mismatches == std::vector<int>{0, 0});
  CHECK(errors == std::vector<int>{0, 0});
}

TEST_CASE("two threads backward through graphs sharing one leaf", "[autograd][engine][threads]") {
  SECTION("one long-lived leaf: the total .grad is the sum of every pass") {
    Tensor x = leaf({1.0, 2.0, 3.0});
    constexpr int kIterations = 300;
    std::atomic<int> errors{0};
    std::atomic<int> fired{0};
    ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { fired.fetch_add(1); });
    std::latch start(2);
    auto worker = [&](std::vector<double> c) {
      Tensor ct = constant(c);
      start.arrive_and_wait();
      for (int it = 0; it < kIterations; ++it) {
        try {
          (x * ct).sum().backward();  // adds c to x.grad (integers: exact in any order)
        } catch (...) {
          errors.fetch_add(1);
        }
      }
    };
    std::thread a(worker, std::vector<double>{1.0, 2.0, 3.0});
    std::thread b(worker, std::vector<double>{10.0, 20.0, 30.0});
    a.join();
    b.join();
    CHECK(errors.load() == 0);
    CHECK(fired.load() == 2 * kIterations);
    CHECK(vec(x.grad()) == std::vector<double>{11.0 * kIterations, 22.0 * kIterations,
                                               33.0 * kIterations});
  }
  SECTION("a fresh leaf per round, both threads starting on it together") {
    constexpr int kRounds = 300;
    std::vector<Tensor> leaves;
    for (int r = 0; r < kRounds; ++r) leaves.push_back(leaf({0.5, -1.0}));
    std::atomic<int> errors{0};
    std::barrier sync(2);
    auto worker = [&](double scale) {
      for (int r = 0; r < kRounds; ++r) {
        sync.arrive_and_wait();
        try {
          const Tensor& x = leaves[r];
          ((x * x) * scale + x).sum().backward();  // 2 scale x + 1
        } catch (...) {
          errors.fetch_add(1);
        }
      }
    };
    std::thread a(worker, 1.0), b(worker, 3.0);
    a.join();
    b.join();
    CHECK(errors.load() == 0);
    int wrong = 0;
    for (const Tensor& x : leaves) {
      // (2*1*x + 1) + (2*3*x + 1) = 8x + 2
      if (!x.grad().defined() || vec(x.grad()) != std::vector<double>{6.0, -6.0}) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

// --- the GraphTask API (distributed autograd's view of the engine) ------------------------------

TEST_CASE("a GraphTask with an extra root fed later from another thread",
          "[autograd][engine][graph_task]") {
  Tensor x = leaf({1.0, 2.0, 3.0}), w = leaf({2.0, -1.0, 0.5});
  Tensor sent = x * w;                    // as if sent to another worker
  Tensor local = (x * 3.0).sum();         // this worker's own loss
  auto send = std::make_shared<FakeSendBackward>(sent);
  auto root = std::make_shared<TestRoot>(std::vector<ag::Edge>{ag::gradient_edge(local)},
                                         std::vector<Tensor>{gw::ones({}, gw::kFloat64)});
  ag::ExecuteOptions options;
  options.extra_roots = {send};
  ag::GraphTask task(root, options);

  task.run();  // the local part runs; x's accumulation waits for the send's gradient
  CHECK_FALSE(task.finished());
  CHECK(send->calls == 0);
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());

  Tensor remote = constant({10.0, 20.0, 30.0});
  std::thread network([&] { task.add_gradient(send, 0, remote); });
  network.join();
  task.run();
  CHECK(task.finished());
  CHECK(send->calls == 1);
  CHECK(vec(send->received) == std::vector<double>{10.0, 20.0, 30.0});
  // dx = 3 + w * remote; dw = x * remote
  CHECK(vec(x.grad()) == std::vector<double>{23.0, -17.0, 18.0});
  CHECK(vec(w.grad()) == std::vector<double>{10.0, 40.0, 90.0});
}

TEST_CASE("a GraphTask made only of extra roots, fed by two threads at once",
          "[autograd][engine][graph_task]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor s1 = x * 2.0, s2 = x * x;
  auto send1 = std::make_shared<FakeSendBackward>(s1);
  auto send2 = std::make_shared<FakeSendBackward>(s2);
  ag::ExecuteOptions options;
  options.extra_roots = {send1, send2};
  ag::GraphTask task(nullptr, options);
  CHECK_FALSE(task.finished());
  std::latch start(2);
  std::thread a([&] {
    start.arrive_and_wait();
    task.add_gradient(send1, 0, constant({1.0, 1.0}));
  });
  std::thread b([&] {
    start.arrive_and_wait();
    task.add_gradient(send2, 0, constant({5.0, 7.0}));
  });
  a.join();
  b.join();
  task.run();
  CHECK(task.finished());
  CHECK(send1->calls == 1);
  CHECK(send2->calls == 1);
  // 2 * 1 + 2x * g2
  CHECK(vec(x.grad()) == std::vector<double>{2.0 + 10.0, 2.0 + 28.0});
}

TEST_CASE("a leaf sink collects leaf gradients instead of .grad", "[autograd][engine][graph_task]") {
  Tensor x = leaf({1.0, 2.0}), w = leaf({3.0, 4.0});
  int post_fired = 0, hook_calls = 0;
  bool sink_visible_in_hook = false;
  ag::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post_fired; });
  ag::register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++post_fired; });
  x.register_hook([&](const Tensor& g) {
    ++hook_calls;
    sink_visible_in_hook = ag::current_leaf_sink() != nullptr;
    return g;
  });
  gw::TensorMap<Tensor> collected;
  std::map<std::string, int> calls;
  std::mutex mu;
  ag::ExecuteOptions options;
  options.leaf_sink = [&](const Tensor& leaf_tensor, const Tensor& g) {
    std::lock_guard lock(mu);
    calls[leaf_tensor.same(x) ? "x" : leaf_tensor.same(w) ? "w" : "?"] += 1;
    auto it = collected.find(leaf_tensor);
    if (it == collected.end()) {
      collected.emplace(leaf_tensor, g.clone());
    } else {
      it->second = it->second + g;
    }
  };
  // x is used in two branches: the sink still sees one, summed gradient.
  Tensor y = (x * w).sum() + (x * 5.0).sum();
  ag::run_backward({ag::gradient_edge(y)}, {gw::ones({}, gw::kFloat64)}, options);

  CHECK(calls == std::map<std::string, int>{{"x", 1}, {"w", 1}});
  REQUIRE(collected.count(x) == 1);
  REQUIRE(collected.count(w) == 1);
  CHECK(vec(collected.at(x)) == std::vector<double>{8.0, 9.0});
  CHECK(vec(collected.at(w)) == std::vector<double>{1.0, 2.0});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  CHECK(post_fired == 0);
  CHECK(hook_calls == 1);  // the leaf's own tensor hook still runs
  CHECK(sink_visible_in_hook);
  CHECK(ag::current_leaf_sink() == nullptr);  // the sink belonged to that task only

  // An ordinary backward afterwards accumulates into .grad and fires the hooks again.
  (x * w).sum().backward();
  CHECK(vec(x.grad()) == std::vector<double>{3.0, 4.0});
  CHECK(post_fired == 2);
}

TEST_CASE("a GraphTask with a leaf sink and an extra root", "[autograd][engine][graph_task]") {
  // Distributed backward in one picture: local loss + a send whose gradient arrives later,
  // leaf gradients going to the context's map.
  Tensor x = leaf({1.0, -1.0});
  Tensor sent = gw::tanh(x);
  Tensor local = (x * x).sum();
  auto send = std::make_shared<FakeSendBackward>(sent);
  auto root = std::make_shared<TestRoot>(std::vector<ag::Edge>{ag::gradient_edge(local)},
                                         std::vector<Tensor>{gw::ones({}, gw::kFloat64)});
  gw::TensorMap<Tensor> context;
  ag::ExecuteOptions options;
  options.extra_roots = {send};
  options.leaf_sink = [&](const Tensor& l, const Tensor& g) { context[l] = g.clone(); };
  ag::GraphTask task(root, options);
  task.run();
  CHECK(context.empty());
  std::thread network([&] { task.add_gradient(send, 0, constant({2.0, 4.0})); });
  network.join();
  task.run();
  CHECK(task.finished());
  REQUIRE(context.count(x) == 1);
  // 2x + (1 - tanh^2 x) g
  double d = 1 - std::tanh(1.0) * std::tanh(1.0);
  CHECK(near(vec(context.at(x)), {2.0 + 2.0 * d, -2.0 + 4.0 * d}));
  CHECK_FALSE(x.grad().defined());
}
