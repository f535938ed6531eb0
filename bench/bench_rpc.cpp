// RPC benchmarks: two agents in this process talking over 127.0.0.1, each case beside a raw
// TCP anchor doing the same bytes' round trip with blocking sockets in the same run:
//   - a small rpc_sync round trip against a 64-byte TCP ping-pong,
//   - tensor round trips (a registered identity function) against a TCP echo of the same size,
//   - rpc_async throughput with 64 calls in flight against PyTorch 1.13's published figure.
#include <array>
#include <future>
#include <thread>

#include <asio.hpp>

#include "bench/harness.h"
#include "core/ops.h"
#include "dist/store/hash_store.h"
#include "rpc/rpc.h"

// Returns its argument: the tensor goes there and back with no work in between, like the echo.
gw::Tensor echo(gw::Tensor t) { return t; }
GW_RPC_FUNCTION(echo);

namespace {

using asio::ip::tcp;
using gw::bench::Reporter;

// A TCP echo peer on a thread: reads `size` bytes, writes them back, until the client closes.
class RawEcho {
 public:
  explicit RawEcho(size_t size)
      : size_(size), acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    server_ = std::thread([this] {
      tcp::socket s(io_);
      acceptor_.accept(s);
      s.set_option(tcp::no_delay(true));
      std::vector<uint8_t> buf(size_);
      std::error_code ec;
      for (;;) {
        asio::read(s, asio::buffer(buf), ec);
        if (ec) return;
        asio::write(s, asio::buffer(buf), ec);
        if (ec) return;
      }
    });
    client_.connect(acceptor_.local_endpoint());
    client_.set_option(tcp::no_delay(true));
    out_.resize(size_, 1);
    in_.resize(size_);
  }
  ~RawEcho() {
    client_.close();
    server_.join();
  }
  void round_trip() {
    asio::write(client_, asio::buffer(out_));
    asio::read(client_, asio::buffer(in_));
  }

 private:
  size_t size_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  tcp::socket client_{io_};
  std::thread server_;
  std::vector<uint8_t> out_, in_;
};

struct Pair {
  std::unique_ptr<gw::rpc::Agent> a, b;
  Pair() {
    auto store = std::make_shared<gw::dist::HashStore>();
    gw::rpc::RpcBackendOptions o;
    o.store = store;
    o.num_worker_threads = 2;
    auto fb = std::async(std::launch::async,
                         [&] { return std::make_unique<gw::rpc::Agent>("server", 1, 2, o); });
    a = std::make_unique<gw::rpc::Agent>("client", 0, 2, o);
    b = fb.get();
  }
  ~Pair() {
    auto fb = std::async(std::launch::async, [&] { b->shutdown(); });
    a->shutdown();
    fb.get();
  }
};

void bench_small(Reporter& report) {
  if (!report.wants("rpc", "rpc_sync small")) return;
  RawEcho raw(64);
  auto [t, r] = gw::bench::seconds_per_call_pair(
      [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2)); },
      [&] { raw.round_trip(); });
  report.add(
      {"rpc", "rpc_sync small (min(1, 2))", t * 1e6, "us", "raw tcp 64 B ping-pong", r * 1e6});
  report.add({"rpc", "rpc_sync small (min(1, 2))", t * 1e6, "us", "pytorch 1.13 rpc_sync", 600,
              "published figure"});
}

void bench_async(Reporter& report) {
  if (!report.wants("rpc", "rpc_async 64 in flight")) return;
  constexpr int kInFlight = 64;
  double t = gw::bench::seconds_per_call([&] {
    std::vector<gw::Future<int64_t>> futs;
    futs.reserve(kInFlight);
    for (int i = 0; i < kInFlight; ++i) futs.push_back(gw::rpc::rpc_async<int64_t>(1, "min", i, 2));
    for (auto& f : futs) f.wait();
  });
  report.add({"rpc", "rpc_async, 64 in flight", kInFlight / t, "calls/s", "pytorch 1.13 rpc_async",
              5000, "published figure"});
}

void bench_tensors(Reporter& report) {
  for (int64_t mib : {1, 16, 64}) {
    std::string name = "tensor round trip " + std::to_string(mib) + " MiB";
    if (!report.wants("rpc", name)) continue;
    gw::Tensor x = gw::ones({mib << 18});  // float32: 4 bytes each
    RawEcho raw(x.nbytes());
    auto [t, r] = gw::bench::seconds_per_call_pair(
        [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync(1, echo, x)); },
        [&] { raw.round_trip(); }, 0.2, 5);
    double bytes = 2.0 * x.nbytes();
    report.add({"rpc", name, bytes / t / 1e9, "GB/s", "raw tcp echo, same size", bytes / r / 1e9});
  }
}

}  // namespace

int main(int argc, char** argv) {
  Reporter report(argc, argv);
  Pair p;
  gw::rpc::Agent::Use use(*p.a);
  bench_small(report);
  bench_async(report);
  bench_tensors(report);
  return 0;
}
