// Distributed autograd against local autograd on random graphs: a seed draws a program of tensor
// ops spread over three workers (local ops, RPCs returning tensors, nested RPCs that come back
// through another worker or the driver itself, RRefs owned elsewhere fetched with to_here, here
// or from a third worker), run once distributed and once locally, in float64, with the same
// leaves. Every gradient must match to 1e-12. FAST mode needs every RPC's result to reach the
// loss, so the loss uses every value here (graphs with unused branches wait for SMART mode).
//
// Seeds are printed on failure (INFO) and chosen with GW_DIST_AUTOGRAD_SEEDS=first:count; the
// default is a fixed set, so that ./gw test is reproducible.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "dist/autograd/dist_autograd.h"
#include "tests/dist/autograd/dist_functions.h"
#include "tests/rpc/group.h"

using namespace gw;
using namespace gw::dist_autograd;
using namespace gw::dist_autograd::testing;
using gw::rpc::testing::Group;

namespace {

constexpr int kWorkers = 3;

// One step of a program; every step but kRemoteLeaf appends a value.
struct Step {
  enum Kind { kLeaf, kRemoteLeaf, kLocal, kRpc, kNested, kToHere, kFetchOp } kind;
  int64_t code = 0, code2 = 0;  // d_op codes
  int worker = 0, worker2 = 0;  // where it runs (kRpc, kNested, kFetchOp; kRemoteLeaf: owner)
  size_t a = 0, b = 0;          // values (kToHere, kFetchOp: `a` is an RRef leaf)
  int64_t seed = 0;             // kLeaf, kRemoteLeaf
};

std::string describe(const std::vector<Step>& steps) {
  static const char* names[] = {"leaf",   "remote_leaf", "local",   "rpc",
                                "nested", "to_here",     "fetch_op"};
  std::ostringstream os;
  for (const auto& s : steps)
    os << names[s.kind] << "(code " << s.code << "/" << s.code2 << ", w" << s.worker << "/w"
       << s.worker2 << ", " << s.a << ", " << s.b << ", seed " << s.seed << ") ";
  return os.str();
}

std::vector<Step> draw(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<Step> steps;
  size_t values = 0, rrefs = 0;
  const int leaves = 2 + static_cast<int>(pick(2)), remote_leaves = static_cast<int>(pick(3));
  for (int i = 0; i < leaves; ++i) {
    steps.push_back({Step::kLeaf, 0, 0, 0, 0, 0, 0, static_cast<int64_t>(seed * 31 + i)});
    ++values;
  }
  for (int i = 0; i < remote_leaves; ++i) {
    steps.push_back({Step::kRemoteLeaf, 0, 0, 1 + static_cast<int>(pick(kWorkers - 1)), 0, 0, 0,
                     static_cast<int64_t>(seed * 31 + 17 + i)});
    ++rrefs;
  }
  std::vector<bool> fetched(rrefs, false);
  const int ops = 4 + static_cast<int>(pick(9));
  for (int i = 0; i < ops; ++i) {
    Step s{};
    const size_t kind = pick(rrefs > 0 ? 6 : 3);
    s.code = static_cast<int64_t>(pick(kNumOps));
    s.code2 = static_cast<int64_t>(pick(kNumOps));
    s.worker = 1 + static_cast<int>(pick(kWorkers - 1));
    s.worker2 = static_cast<int>(pick(kWorkers));  // the driver, the caller itself, or another
    s.a = pick(values);
    s.b = pick(values);
    switch (kind) {
      case 0:
        s.kind = Step::kLocal;
        break;
      case 1:
        s.kind = Step::kRpc;
        break;
      case 2:
        s.kind = Step::kNested;
        break;
      case 3:
      case 4:
        s.kind = Step::kToHere;
        s.a = pick(rrefs);
        fetched[s.a] = true;
        break;
      default:
        s.kind = Step::kFetchOp;
        s.a = pick(rrefs);
        s.b = pick(values);
        fetched[s.a] = true;
        break;
    }
    steps.push_back(s);
    ++values;
  }
  // FAST mode: every RRef leaf is fetched, so that its gradient comes back.
  for (size_t r = 0; r < rrefs; ++r)
    if (!fetched[r]) steps.push_back({Step::kToHere, 0, 0, 0, 0, r, 0, 0});
  return steps;
}

// The loss over `values`: sum_k (k + 1) * values[k].sum(), so that every value reaches it.
Tensor loss_of(const std::vector<Tensor>& values) {
  Tensor loss = values[0].sum();
  for (size_t k = 1; k < values.size(); ++k) loss = loss + values[k].sum() * double(k + 1);
  return loss;
}

struct Gradients {
  std::vector<Tensor> leaves, remote_leaves;
};

// The program on local autograd: an RPC is the function itself, to_here the value.
Gradients run_local(const std::vector<Step>& steps) {
  std::vector<Tensor> values, rrefs;
  std::vector<Tensor> leaves;
  for (const auto& s : steps) {
    switch (s.kind) {
      case Step::kLeaf:
        leaves.push_back(d_leaf64(s.seed));
        values.push_back(leaves.back());
        break;
      case Step::kRemoteLeaf:
        rrefs.push_back(d_leaf64(s.seed));
        break;
      case Step::kLocal:
      case Step::kRpc:
        values.push_back(d_op(s.code, values[s.a], values[s.b]));
        break;
      case Step::kNested:
        values.push_back(d_op(s.code2, d_op(s.code, values[s.a], values[s.b]), values[s.a]));
        break;
      case Step::kToHere:
        values.push_back(rrefs[s.a]);
        break;
      case Step::kFetchOp:
        values.push_back(d_op(s.code, rrefs[s.a], values[s.b]));
        break;
    }
  }
  loss_of(values).backward();
  Gradients g;
  for (const auto& l : leaves) g.leaves.push_back(l.grad());
  for (const auto& r : rrefs) g.remote_leaves.push_back(r.grad());
  return g;
}

// The same program distributed, driven from worker 0 inside a context.
Gradients run_distributed(const std::vector<Step>& steps) {
  Context ctx;
  std::vector<Tensor> values, leaves;
  std::vector<rpc::RRef<Tensor>> rrefs;
  std::vector<int> owners;
  auto name = [](int w) { return "worker" + std::to_string(w); };
  for (const auto& s : steps) {
    switch (s.kind) {
      case Step::kLeaf:
        leaves.push_back(d_leaf64(s.seed));
        values.push_back(leaves.back());
        break;
      case Step::kRemoteLeaf:
        rrefs.push_back(rpc::remote(name(s.worker), d_leaf64, s.seed));
        owners.push_back(s.worker);
        break;
      case Step::kLocal:
        values.push_back(d_op(s.code, values[s.a], values[s.b]));
        break;
      case Step::kRpc:
        values.push_back(rpc::rpc_sync(name(s.worker), d_op, s.code, values[s.a], values[s.b]));
        break;
      case Step::kNested:
        values.push_back(rpc::rpc_sync(name(s.worker), d_nested_op, name(s.worker2), s.code,
                                       s.code2, values[s.a], values[s.b]));
        break;
      case Step::kToHere:
        values.push_back(rrefs[s.a].to_here());
        break;
      case Step::kFetchOp:
        values.push_back(
            rpc::rpc_sync(name(s.worker), d_fetch_op, s.code, rrefs[s.a], values[s.b]));
        break;
    }
  }
  backward(ctx.id(), {loss_of(values)});
  Gradients g;
  const GradientMap grads = get_gradients(ctx.id());
  for (const auto& l : leaves) {
    auto it = grads.find(l);
    g.leaves.push_back(it == grads.end() ? Tensor() : it->second);
  }
  for (size_t r = 0; r < rrefs.size(); ++r)
    g.remote_leaves.push_back(
        rpc::rpc_sync(name(owners[r]), d_grad_of, static_cast<int64_t>(ctx.id()), rrefs[r]));
  return g;
}

void check_same(const std::vector<Tensor>& got, const std::vector<Tensor>& expected,
                const char* what) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " " << i);
    REQUIRE(got[i].defined() == expected[i].defined());
    if (expected[i].defined()) CHECK(allclose(got[i], expected[i], 1e-12, 1e-12));
  }
}

std::pair<uint64_t, uint64_t> seeds_to_run() {
  if (const char* v = std::getenv("GW_DIST_AUTOGRAD_SEEDS"); v != nullptr && *v != '\0') {
    const std::string s(v);
    const auto colon = s.find(':');
    return {std::stoull(s.substr(0, colon)),
            colon == std::string::npos ? 1 : std::stoull(s.substr(colon + 1))};
  }
  return {1, 24};
}

}  // namespace

TEST_CASE("FAST mode on random graphs over three workers equals local autograd",
          "[dist_autograd][random]") {
  Group g(kWorkers);
  rpc::Agent::Use use(g[0]);
  const auto [first, count] = seeds_to_run();
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const auto steps = draw(seed);
    INFO("seed " << seed << " (GW_DIST_AUTOGRAD_SEEDS=" << seed << ":1): " << describe(steps));
    const Gradients expected = run_local(steps);
    const Gradients got = run_distributed(steps);
    check_same(got.leaves, expected.leaves, "leaf");
    check_same(got.remote_leaves, expected.remote_leaves, "remote leaf");
  }
  wait_for_releases();
  for (int w = 0; w < kWorkers; ++w) {
    rpc::Agent::Use on(g[w]);
    CHECK(num_contexts() == 0);
  }
}
