// RPC under TLS (store/tls.h), over real sockets on loopback: workers of one job's CA talk,
// a worker outside it (another CA, or no TLS at all) gets nothing run. Certificates come from
// throwaway CAs (tests/tls_pki.h).
#include <catch2/catch.hpp>

#include <future>

#include "core/ops.h"
#include "tests/rpc/group.h"
#include "tests/rpc/test_functions.h"
#include "tests/tls_pki.h"

using namespace gw;
using namespace gw::rpc;
using namespace gw::rpc::testing;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

RpcBackendOptions tls_options(const store::TlsOptions& tls, const store::JobKey& key) {
  RpcBackendOptions o = Group::small_options();
  o.job_key = key;
  o.tls = tls;
  o.rpc_timeout = 10s;
  return o;
}

// Two workers with options of their own, started together (each waits for the other to
// publish its address); destroyed without a graceful shutdown, which would need them to talk.
struct Pair {
  std::shared_ptr<gw::store::HashStore> store = std::make_shared<gw::store::HashStore>();
  std::unique_ptr<Agent> a, b;
  Pair(RpcBackendOptions oa, RpcBackendOptions ob) {
    oa.store = ob.store = store;
    auto start = [](std::string name, int rank, RpcBackendOptions o) {
      return std::async(std::launch::async,
                        [=] { return std::make_unique<Agent>(name, rank, 2, o); });
    };
    auto fa = start("worker0", 0, oa), fb = start("worker1", 1, ob);
    a = fa.get();
    b = fb.get();
  }
};

}  // namespace

TEST_CASE("RPC over TLS: calls both ways and 16 MiB tensors arrive intact", "[rpc][tls]") {
  test::Pki pki;
  Group g(2, tls_options(pki.issue("job"), store::JobKey::generate()));
  {
    Agent::Use use(g[0]);
    CHECK(rpc_sync(1, whoami) == "worker1");
    Generator gen(11);
    Tensor big = randn({4, 1 << 20}, gen);  // 16 MiB each way: decrypted into tensor storage
    CHECK(gw::equal(rpc_sync<Tensor>("worker1", my_add, big, ones({4, 1 << 20})), add(big, 1.0)));
    // Many small calls in flight at once share the connection's TLS writes.
    std::vector<Future<Tensor>> calls;
    for (int i = 0; i < 64; ++i)
      calls.push_back(rpc_async<Tensor>("worker1", my_add, full({3}, float(i)), ones({3})));
    for (int i = 0; i < 64; ++i) CHECK(calls[i].wait(10s).to_vector<float>()[2] == float(i + 1));
  }
  Agent::Use use(g[1]);
  CHECK(rpc_sync(0, whoami) == "worker0");
}

TEST_CASE("a worker outside the job's CA, or without TLS, gets nothing run by a TLS worker",
          "[rpc][tls]") {
  test::Pki pki, other;
  const store::JobKey key = store::JobKey::generate();
  const int64_t bumped = bumps();
  SECTION("a certificate from another CA") {
    Pair p(tls_options(other.issue("intruder"), key), tls_options(pki.issue("worker1"), key));
    Agent::Use use(*p.a);
    CHECK_THROWS_WITH(rpc_sync(1, bump), Contains("TLS"));
  }
  SECTION("a certificate from another CA, trusting ours: our worker refuses it") {
    store::TlsOptions foreign = other.issue("intruder");
    foreign.ca_file = pki.issue("unused").ca_file;
    Pair p(tls_options(foreign, key), tls_options(pki.issue("worker1"), key));
    Agent::Use use(*p.a);
    CHECK_THROWS_WITH(rpc_sync(1, bump), Contains("TLS"));
  }
  SECTION("no TLS at all") {
    Pair p(tls_options({}, key), tls_options(pki.issue("worker1"), key));
    Agent::Use use(*p.a);
    CHECK_THROWS_AS(rpc_sync(1, bump), IoError);
  }
  SECTION("the other way round: a TLS worker calling one without TLS") {
    Pair p(tls_options(pki.issue("worker0"), key), tls_options({}, key));
    Agent::Use use(*p.a);
    CHECK_THROWS_AS(rpc_sync(1, bump), IoError);
  }
  CHECK(bumps() == bumped);  // bump ran nowhere
}

TEST_CASE("TLS options are checked when the agent starts", "[rpc][tls]") {
  test::Pki pki;
  store::TlsOptions partial = pki.issue("worker0");
  partial.ca_file.clear();
  RpcBackendOptions o = tls_options(partial, store::JobKey::generate());
  o.store = std::make_shared<gw::store::HashStore>();
  CHECK_THROWS_WITH(Agent("worker0", 0, 1, o),
                    Contains("[init_rpc] TLS needs a certificate, its key and the job's CA") &&
                        Contains("ca_file ''"));
}
