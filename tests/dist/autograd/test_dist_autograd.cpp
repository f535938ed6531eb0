// Distributed autograd with ranks as threads: every gradient is compared with local autograd
// on the same computation, with the same values.
#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "tests/dist/autograd/dist_functions.h"
#include "tests/dist/autograd/dist_group.h"

using namespace gw;
using namespace gw::dist::autograd;
using namespace gw::dist::autograd::testing;
using Group = gw::dist::testing::DistGroup;

namespace {
Tensor seeded_leaf(uint64_t seed) {
  Generator gen(seed);
  return rand({3, 3}, gen).requires_grad_();
}

// The local gradients of `f` at fresh copies of `inputs`.
template <typename F>
std::vector<Tensor> local_grads(const std::vector<Tensor>& inputs, F f) {
  std::vector<Tensor> copies;
  for (const auto& t : inputs) copies.push_back(t.detach().clone().requires_grad_());
  f(copies).backward();
  std::vector<Tensor> out;
  for (const auto& c : copies) out.push_back(c.grad());
  return out;
}

void check_grads(const GradientMap& grads, const std::vector<Tensor>& leaves,
                 const std::vector<Tensor>& expected) {
  REQUIRE(grads.size() == leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    INFO("leaf " << i);
    REQUIRE(grads.contains(leaves[i]));
    CHECK(allclose(grads.at(leaves[i]), expected[i]));
  }
}

int64_t contexts_on(Group& g, int rank) {
  rpc::Agent::Use use(g[rank]);
  return static_cast<int64_t>(num_contexts());
}
}  // namespace

TEST_CASE("an agent started without gw::dist::init_rpc refuses distributed autograd, naming it",
          "[dist_autograd]") {
  // worker0 starts as gw::dist::init_rpc does, worker1 as plain gw::rpc::init_rpc does.
  rpc::testing::Group g(2, [](int rank) {
    rpc::RpcBackendOptions o = rpc::testing::Group::small_options();
    return rank == 0 ? gw::dist::with_dist(o) : o;
  });
  SECTION("a context on the plain agent") {
    rpc::Agent::Use use(g[1]);
    CHECK_THROWS_WITH(Context(), Catch::Contains("gw::dist::init_rpc"));
  }
  SECTION("a call in a context to the plain agent") {
    rpc::Agent::Use use(g[0]);
    Context ctx;
    Tensor a = seeded_leaf(1);
    CHECK_THROWS_WITH(rpc::rpc_sync<Tensor>("worker1", "add", a, a),
                      Catch::Contains("gw::dist::init_rpc"));
  }
  SECTION("with_dist twice installs distributed autograd once") {
    rpc::RpcBackendOptions o = gw::dist::with_dist(gw::dist::with_dist({}));
    CHECK(o.extensions.size() == 1);
  }
}

TEST_CASE("the design note's example: gradients through rpc_sync equal local ones",
          "[dist_autograd]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  Tensor t1 = seeded_leaf(1), t2 = seeded_leaf(2), t4 = seeded_leaf(4);
  auto f = [](const std::vector<Tensor>& t) { return ((t[0] + t[1]) * t[2]).sum(); };
  uint64_t id;
  {
    Context ctx;
    id = ctx.id();
    CHECK(current_context_id() == id);
    CHECK(id >> 48 == 0);  // made on worker 0 ...
    Tensor t3 = rpc::rpc_sync("worker1", d_add, t1, t2);
    CHECK(t3.grad_fn() != nullptr);  // its history is the recv function
    Tensor loss = (t3 * t4).sum();
    backward(id, {loss});
    check_grads(get_gradients(id), {t1, t2, t4}, local_grads({t1, t2, t4}, f));
    CHECK_FALSE(t1.grad().defined());  // gradients go to the context, not .grad
    CHECK(contexts_on(g, 1) == 1);     // worker1 joined the context
  }
  CHECK(current_context_id() == 0);
  CHECK(num_contexts() == 0);  // released here at once
  wait_for_releases();
  CHECK(contexts_on(g, 1) == 0);  // ... and on every worker it reached
  CHECK_THROWS_WITH(get_gradients(id), Catch::Contains("has no context"));
  rpc::Agent::Use on_worker1(g[1]);
  Context other;
  CHECK(other.id() >> 48 == 1);  // ... and this one on worker 1
}

TEST_CASE("nested RPCs: A -> B -> C with tensors flowing back", "[dist_autograd]") {
  Group g(3);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(5), b = seeded_leaf(6);
  auto f = [](const std::vector<Tensor>& t) { return ((t[0] * t[1] + t[0]) * t[0]).sum(); };
  {
    Context ctx;
    Tensor r = rpc::rpc_sync("worker1", d_nested, std::string("worker2"), a, b);
    backward(ctx.id(), {(r * a).sum()});
    check_grads(get_gradients(ctx.id()), {a, b}, local_grads({a, b}, f));
    CHECK(contexts_on(g, 2) == 1);  // worker2 was reached only through worker1
  }
  wait_for_releases();
  CHECK(contexts_on(g, 1) == 0);
  CHECK(contexts_on(g, 2) == 0);  // released through worker1
}

TEST_CASE("RRef.to_here chains record send and recv functions", "[dist_autograd][rref]") {
  Group g(3);
  rpc::Agent::Use use(g[0]);
  // The value lives on worker1; worker2 fetches it and triples it; worker0 fetches it too.
  Context ctx;
  auto x = rpc::remote("worker1", d_leaf, int64_t{7});
  Tensor y = rpc::rpc_sync("worker2", d_fetch_triple, x);
  Tensor loss = (y * y).sum() + x.to_here().sum();
  backward(ctx.id(), {loss});
  Tensor value = seeded_leaf(7).detach();
  Tensor expected = local_grads({value}, [](const std::vector<Tensor>& t) {
    return ((t[0] * 3.0) * (t[0] * 3.0)).sum() + t[0].sum();
  })[0];
  CHECK(allclose(rpc::rpc_sync("worker1", d_grad_of, static_cast<int64_t>(ctx.id()), x), expected));
  CHECK(get_gradients(ctx.id()).empty());  // no leaf of worker0 took part
}

TEST_CASE("retain_graph allows a second backward; gradients accumulate in the context",
          "[dist_autograd]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(8), b = seeded_leaf(9);
  Context ctx;
  Tensor loss = (rpc::rpc_sync("worker1", d_mul, a, b) * a).sum();
  backward(ctx.id(), {loss}, /*retain_graph=*/true);
  auto once = local_grads({a, b}, [](const auto& t) { return (t[0] * t[1] * t[0]).sum(); });
  check_grads(get_gradients(ctx.id()), {a, b}, once);
  backward(ctx.id(), {loss});
  check_grads(get_gradients(ctx.id()), {a, b}, {once[0] * 2.0, once[1] * 2.0});
  // The graph was freed by the second pass (on both workers).
  CHECK_THROWS_WITH(backward(ctx.id(), {loss}), Catch::Contains("second time"));
}

TEST_CASE("contexts of several threads run at once", "[dist_autograd][threads]") {
  Group g(2);
  constexpr int kThreads = 4, kIterations = 20;
  std::vector<std::future<int>> runs;
  for (int t = 0; t < kThreads; ++t)
    runs.push_back(std::async(std::launch::async, [&g, t] {
      rpc::Agent::Use use(g[t % 2]);
      const std::string other = t % 2 ? "worker0" : "worker1";
      int good = 0;
      for (int i = 0; i < kIterations; ++i) {
        Tensor a = seeded_leaf(100 + t * kIterations + i), b = seeded_leaf(7 * t + i);
        Context ctx;
        Tensor loss = (rpc::rpc_sync(other, d_mul, a, b) + a).sum();
        backward(ctx.id(), {loss});
        auto want = local_grads({a, b}, [](const auto& x) { return (x[0] * x[1] + x[0]).sum(); });
        auto grads = get_gradients(ctx.id());
        good += allclose(grads.at(a), want[0]) && allclose(grads.at(b), want[1]);
      }
      return good;
    }));
  for (auto& r : runs) CHECK(r.get() == kIterations);
  for (int rank = 0; rank < 2; ++rank) {
    rpc::Agent::Use use(g[rank]);
    wait_for_releases();
  }
  CHECK(contexts_on(g, 0) == 0);
  CHECK(contexts_on(g, 1) == 0);
}

TEST_CASE("an unused RPC result that shares no leaf does not change the gradients",
          "[dist_autograd][fast]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(10), b = seeded_leaf(11), c = seeded_leaf(12), e = seeded_leaf(13);
  Context ctx;
  Tensor d = rpc::rpc_sync("worker1", d_add, a, b);
  Tensor unused = rpc::rpc_sync("worker1", d_mul, c, e);  // never reaches the loss
  backward(ctx.id(), {d.sum()});
  auto grads = get_gradients(ctx.id());
  CHECK(allclose(grads.at(a), ones({3, 3})));
  CHECK(allclose(grads.at(b), ones({3, 3})));
  CHECK_FALSE(grads.contains(c));  // as in local autograd: no path, no gradient
  CHECK_FALSE(grads.contains(e));
}

TEST_CASE("an unused RPC whose inputs feed the loss: FAST mode raises, SMART mode runs it",
          "[dist_autograd][fast][smart]") {
  // The design note's own example: b feeds both RPCs, e is unused. FAST mode would wait forever for
  // e's gradient (PyTorch hangs); gradwire finishes and says why b's gradient is incomplete.
  // SMART mode gives b d's gradient alone, as local autograd does.
  Group g(2);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(14), b = seeded_leaf(15), c = seeded_leaf(16);
  for (Mode mode : {Mode::kFast, Mode::kSmart}) {
    Context ctx;
    Tensor d = rpc::rpc_sync("worker1", d_add, a, b);
    Tensor e = rpc::rpc_sync("worker1", d_mul, b, c);
    (void)e;
    if (mode == Mode::kFast) {
      CHECK_THROWS_WITH(backward(ctx.id(), {d.sum()}),
                        Catch::Contains("FAST mode") && Catch::Contains("AccumulateGrad"));
      continue;
    }
    backward(ctx.id(), {d.sum()}, {.mode = mode});
    check_grads(get_gradients(ctx.id()), {a, b},
                local_grads({a, b}, [](const auto& v) { return (v[0] + v[1]).sum(); }));
  }
}

TEST_CASE("SMART mode: a received tensor also sent to an unused RPC is found on the path",
          "[dist_autograd][smart]") {
  // x comes from worker1 and goes on to worker2, whose result is unused. x's recv function may
  // wait for that unused send: worker0 tells worker1 at once that x's send function is live,
  // holds x's recv, and releases it when the pass closes.
  Group g(3);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(20), b = seeded_leaf(21), c = seeded_leaf(22);
  for (bool retain : {true, false}) {  // two passes on one context, then one on another
    Context ctx;
    Tensor x = rpc::rpc_sync("worker1", d_add, a, b);
    Tensor unused = rpc::rpc_sync("worker2", d_mul, x, c);
    (void)unused;
    const int passes = retain ? 2 : 1;
    for (int p = 0; p < passes; ++p)
      backward(ctx.id(), {(x * x).sum()}, {.retain_graph = p + 1 < passes, .mode = Mode::kSmart});
    auto expected =
        local_grads({a, b}, [](const auto& v) { return ((v[0] + v[1]) * (v[0] + v[1])).sum(); });
    for (auto& t : expected) t = t * double(passes);
    check_grads(get_gradients(ctx.id()), {a, b}, expected);
    CHECK_THROWS_WITH(backward(ctx.id(), {(x * x).sum()}), Catch::Contains("FAST mode requires"));
  }
}

TEST_CASE("an exception in a remote backward function is raised on the caller",
          "[dist_autograd][errors]") {
  Group g(3);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(17);
  {
    Context ctx;
    Tensor r = rpc::rpc_sync("worker1", d_failing_backward, a);
    CHECK_THROWS_WITH(backward(ctx.id(), {r.sum()}),
                      Catch::Contains("worker1") && Catch::Contains("backward failed on purpose"));
  }
  {  // one hop further: worker2's failure travels back through worker1
    Context ctx;
    Tensor bad = rpc::rpc_sync("worker1", d_relay, std::string("worker2"),
                               std::string("d_failing_backward"), a);
    CHECK_THROWS_WITH(backward(ctx.id(), {bad.sum()}),
                      Catch::Contains("worker1") && Catch::Contains("worker2") &&
                          Catch::Contains("backward failed on purpose"));
  }
  // The group still works afterwards.
  Context ctx;
  Tensor r = rpc::rpc_sync("worker1", d_add, a, a);
  backward(ctx.id(), {r.sum()});
  CHECK(allclose(get_gradients(ctx.id()).at(a), full({3, 3}, 2.0)));
}

TEST_CASE("bad arguments to the distributed autograd API are clear errors",
          "[dist_autograd][errors]") {
  Group g(1);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(18);
  CHECK_THROWS_WITH(backward(12345, {a.sum()}), Catch::Contains("has no context 12345"));
  Context ctx;
  CHECK_THROWS_WITH(backward(ctx.id(), {a * 2.0}), Catch::Contains("roots must be scalars"));
  CHECK_THROWS_WITH(backward(ctx.id(), {}), Catch::Contains("no roots"));
  CHECK_THROWS_WITH(backward(ctx.id(), {ones({})}), Catch::Contains("does not require grad"));
  CHECK_THROWS_WITH(Context(), Catch::Contains("do not nest"));
  // A local graph in a context: the gradients still go to the context.
  backward(ctx.id(), {(a * a).sum()});
  CHECK(allclose(get_gradients(ctx.id()).at(a), a.detach() * 2.0));
  // A graph with a recv function outside distributed backward.
  Tensor r = rpc::rpc_sync("worker0", d_add, a, a);
  CHECK_THROWS_WITH(r.sum().backward(), Catch::Contains("dist::autograd::backward"));
}

TEST_CASE("a response that arrives after its context was left fails instead of reviving it",
          "[dist_autograd][errors]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  d_close_gate();
  Future<Tensor> late;
  {
    Context ctx;
    late = rpc::rpc_async("worker1", d_gated, seeded_leaf(19));
  }
  d_open_gate();  // the response, recorded in the context, arrives now
  CHECK_THROWS_WITH(late.wait(), Catch::Contains("has no context"));
  CHECK(num_contexts() == 0);
}

TEST_CASE("a call that cannot be sent leaves no send function behind", "[dist_autograd][fast]") {
  Group g(2);
  rpc::Agent::Use use(g[0]);
  Tensor a = seeded_leaf(20);
  Context ctx;
  // An object cannot travel: the request fails before it leaves, after being recorded.
  CHECK_THROWS(rpc::rpc_sync("worker1", "no_such_function", a, rpc::IValue::object({})));
  Tensor r = rpc::rpc_sync("worker1", d_add, a, a);
  backward(ctx.id(), {r.sum()});  // would wait for the failed call's gradient otherwise
  CHECK(allclose(get_gradients(ctx.id()).at(a), full({3, 3}, 2.0)));
}

TEST_CASE("a context adds to a gradient out of place while get_gradients' copy is held",
          "[dist_autograd]") {
  DistAutogradContext ctx(1);
  Tensor w = seeded_leaf(40);
  ctx.accumulate_grad(w, full({3, 3}, 1.0));
  GradientMap held = ctx.gradients();  // shares the context's tensor
  ctx.accumulate_grad(w, full({3, 3}, 2.0));
  CHECK(allclose(held.at(w), full({3, 3}, 1.0)));  // what the caller got stays as it was
  CHECK(allclose(ctx.gradients().at(w), full({3, 3}, 3.0)));
  {
    const Tensor row = ctx.gradients().at(w).select(0, 0);  // a view of it
    held.clear();
    ctx.accumulate_grad(w, full({3, 3}, 4.0));
    CHECK(allclose(row, full({3}, 3.0)));  // the view's memory is left alone too
  }
  CHECK(allclose(ctx.gradients().at(w), full({3, 3}, 7.0)));
  const void* before = ctx.gradients().at(w).raw_data();
  ctx.accumulate_grad(w, full({3, 3}, 1.0));  // nobody else holds it now: in place
  CHECK(ctx.gradients().at(w).raw_data() == before);
  CHECK(allclose(ctx.gradients().at(w), full({3, 3}, 8.0)));
}

TEST_CASE("gradients of an older backward pass do not start it again", "[dist_autograd]") {
  DistAutogradContext ctx(1);
  auto pass_of = [](uint64_t worker, uint64_t n) { return (worker << (64 - kWorkerIdBits)) | n; };
  int made = 0;
  auto make = [&](DistAutogradContext::NodeList) {
    ++made;
    return std::shared_ptr<Pass>();  // no pass to run: only the ids are checked here
  };
  ctx.pass(pass_of(2, 5), make);
  CHECK_THROWS_WITH(ctx.pass(pass_of(2, 4), make), Catch::Contains("gradients of backward pass") &&
                                                       Catch::Contains("arrived after pass"));
  ctx.pass(pass_of(3, 1), make);  // another worker's passes are numbered on their own
  ctx.pass(pass_of(2, 6), make);
  CHECK(made == 3);
}
