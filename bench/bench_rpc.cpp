// RPC benchmarks: two agents in this process talking over 127.0.0.1, each case beside a raw
// TCP anchor doing the same bytes' round trip with blocking sockets in the same run, and
// beside PyTorch 1.13's RPC (TensorPipe, two processes, torch_anchor_rpc.py) doing the same
// calls in the same run:
//   - a small rpc_sync round trip against a 64-byte TCP ping-pong and PyTorch's rpc_sync,
//   - rpc_async throughput with 64 calls in flight against PyTorch's rpc_async,
//   - remote() + to_here() against two raw ping-pongs,
//   - tensor round trips (a registered identity function) against a TCP echo of the same size
//     and PyTorch's round trip through an identity function,
//   - the job key's and TLS's cost: calls, a 16 MiB round trip and connection setup with a key,
//     and with a key under TLS, against the agent without either,
//   - shared memory (rpc/shm.h): the small call and the tensor round trips against the same
//     agents over loopback TCP, interleaved in one run, and the round trips against memcpy,
//   - an RPC world's start-up and graceful shutdown at 64, 256 and 512 processes under gwrun,
//     against linear growth from the 64-process time of the same run.
// The cases before the shared-memory ones run over TCP (shared memory off), as the anchors do.
// Where python3-torch cannot run, the first two fall back to published PyTorch figures.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <thread>

#include <asio.hpp>

#include "bench/harness.h"
#include "core/ops.h"
#include "core/trace.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/tls_pki.h"

// Returns its argument: the tensor goes there and back with no work in between, like the echo.
gw::Tensor echo(gw::Tensor t) { return t; }
GW_RPC_FUNCTION(echo);

namespace {

using asio::ip::tcp;
using gw::bench::Reporter;

constexpr const char* kSmall = "rpc_sync small (min(1, 2))";
constexpr const char* kAsync = "rpc_async, 64 in flight";

std::string tensor_case(int64_t mib) { return "tensor round trip " + std::to_string(mib) + " MiB"; }

// PyTorch's numbers for every case, from one run of torch_anchor_rpc.py (it needs about ten
// seconds: process start-up, rendezvous, then all cases), or nothing when it could not run.
struct TorchAnchor {
  std::optional<std::string> out;
  std::string note;  // which TensorPipe path was measured, shown beside each PyTorch row

  std::optional<double> get(const std::string& key) const {
    return out ? gw::bench::json_number(*out, key) : std::nullopt;
  }
};

TorchAnchor run_torch_anchor() {
  // `timeout` bounds a TensorPipe hang (a peer that never rendezvous, a stuck shutdown) so
  // the suite still finishes; the rows then fall back as if torch were missing.
  std::string script = gw::bench::executable_dir() + "/torch_anchor_rpc.py";
  TorchAnchor a;
  a.out = gw::bench::run_capture("timeout -k 5 120 /usr/bin/python3 " + script + " 2>/dev/null");
  if (a.out && a.out->find("\"rpc_sync_us\"") == std::string::npos) a.out.reset();
  if (a.out) {
    a.note = a.out->find("\"transport\": \"uv\"") != std::string::npos ? "tensorpipe over tcp"
                                                                       : "tensorpipe defaults";
  }
  return a;
}

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

// How a pair's connections are secured: by nothing (a keyless handshake), a job key, TLS; and
// whether they may use shared memory.
struct Security {
  std::optional<gw::store::JobKey> key;
  gw::store::TlsOptions tls;
  bool shared_memory = false;
};

struct Pair {
  std::unique_ptr<gw::rpc::Agent> a, b;
  explicit Pair(const Security& security = {}) {
    auto store = std::make_shared<gw::store::HashStore>();
    gw::rpc::RpcBackendOptions o;
    o.job_key = security.key;
    o.tls = security.tls;
    o.shared_memory = security.shared_memory;
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

void bench_small(Reporter& report, const TorchAnchor& torch) {
  if (!report.wants("rpc", kSmall)) return;
  RawEcho raw(64);
  auto [t, r] = gw::bench::seconds_per_call_pair(
      [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2)); },
      [&] { raw.round_trip(); });
  report.add({"rpc", kSmall, t * 1e6, "us", "raw tcp 64 B ping-pong", r * 1e6});
  if (auto us = torch.get("rpc_sync_us")) {
    report.add({"rpc", kSmall, t * 1e6, "us", "pytorch 1.13", *us, torch.note});
  } else {
    report.add({"rpc", kSmall, t * 1e6, "us", "pytorch 1.13", 600, gw::bench::kPublishedFigure});
  }
}

// rpc_sync with a timeline being recorded (core/trace.h) beside the same call without, in
// alternating rounds; and what each of the call's 7 trace events costs (goal: at most 1 us).
// Nothing is written (cancel).
void bench_traced(Reporter& report) {
  const std::string name = "rpc_sync 8 B, traced";
  if (!report.wants("rpc", name)) return;
  constexpr int kEventsPerCall = 7;  // send, flow; flow, handler, flow; answer, flow
  auto call = [] { gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2)); };
  auto [on, off] = gw::bench::seconds_per_call_pair(
      [&] {
        if (!gw::trace::enabled()) gw::trace::start("bench_rpc.trace");
        call();
      },
      [&] {
        if (gw::trace::enabled()) gw::trace::cancel();
        call();
      });
  gw::trace::cancel();
  report.add({"rpc", name, on * 1e6, "us", "tracing off, same run", off * 1e6});
  report.add({"rpc", "cost per traced event", (on - off) / kEventsPerCall * 1e6, "us", "goal", 1.0,
              gw::bench::kGoal});
}

void bench_async(Reporter& report, const TorchAnchor& torch) {
  if (!report.wants("rpc", kAsync)) return;
  constexpr int kInFlight = 64;
  double t = gw::bench::seconds_per_call([&] {
    std::vector<gw::Future<int64_t>> futs;
    futs.reserve(kInFlight);
    for (int i = 0; i < kInFlight; ++i) futs.push_back(gw::rpc::rpc_async<int64_t>(1, "min", i, 2));
    for (auto& f : futs) f.wait();
  });
  if (auto rate = torch.get("async_calls_per_s")) {
    report.add({"rpc", kAsync, kInFlight / t, "calls/s", "pytorch 1.13", *rate, torch.note});
  } else {
    report.add({"rpc", kAsync, kInFlight / t, "calls/s", "pytorch 1.13", 5000,
                gw::bench::kPublishedFigure});
  }
}

// remote() then to_here(): two round trips (the owner's acknowledgement, then the fetch), plus
// the delete when the RRef goes away; the anchor is two raw ping-pongs.
void bench_remote(Reporter& report) {
  const char* name = "remote + to_here (ones(1))";
  if (!report.wants("rpc", name)) return;
  RawEcho raw(64);
  std::vector<int64_t> shape{1};
  auto [t, r] = gw::bench::seconds_per_call_pair(
      [&] { gw::bench::do_not_optimize(gw::rpc::remote<gw::Tensor>(1, "ones", shape).to_here()); },
      [&] {
        raw.round_trip();
        raw.round_trip();
      });
  report.add({"rpc", name, t * 1e6, "us", "raw tcp, two 64 B ping-pongs", r * 1e6});
}

void bench_tensors(Reporter& report, const TorchAnchor& torch) {
  for (int64_t mib : {1, 16, 64}) {
    std::string name = tensor_case(mib);
    if (!report.wants("rpc", name)) continue;
    gw::Tensor x = gw::ones({mib << 18});  // float32: 4 bytes each
    RawEcho raw(x.nbytes());
    auto [t, r] = gw::bench::seconds_per_call_pair(
        [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync(1, echo, x)); },
        [&] { raw.round_trip(); }, 0.2, 5);
    double bytes = 2.0 * x.nbytes();
    report.add({"rpc", name, bytes / t / 1e9, "GB/s", "raw tcp echo, same size", bytes / r / 1e9});
    // No published figure to fall back on for these: without torch there is no PyTorch row.
    if (auto gbps = torch.get("rt_" + std::to_string(mib) + "mib_gbps")) {
      report.add({"rpc", name, bytes / t / 1e9, "GB/s", "pytorch 1.13", *gbps, torch.note});
    }
  }
}

// The cost of security (README "Security"), a job key alone and a job key under TLS: calls and
// a 16 MiB round trip on a secured pair against a pair with neither, interleaved in one run,
// and the setup of a connection (connect, handshakes, first call). A keyless agent runs the
// job-key handshake with an all-zero key, so the setup rows show what the key (and TLS) add.
void bench_security(Reporter& report, const char* label, const Security& secured) {
  const std::string small = std::string("rpc_sync small, ") + label;
  const std::string big = std::string("tensor round trip 16 MiB, ") + label;
  const std::string setup = std::string("connection setup + first call, ") + label;
  const char* anchor = "the agent without a job key or TLS";
  if (report.wants("rpc", small) || report.wants("rpc", big)) {
    Pair safe(secured), plain;
    auto on = [](Pair& p, auto f) {
      gw::rpc::Agent::Use use(*p.a);
      f();
    };
    if (report.wants("rpc", small)) {
      auto call = [] { gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2)); };
      auto [t, r] =
          gw::bench::seconds_per_call_pair([&] { on(safe, call); }, [&] { on(plain, call); });
      report.add({"rpc", small, t * 1e6, "us", anchor, r * 1e6});
    }
    if (report.wants("rpc", big)) {
      gw::Tensor x = gw::ones({16 << 18});
      auto call = [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync(1, echo, x)); };
      auto [t, r] = gw::bench::seconds_per_call_pair([&] { on(safe, call); },
                                                     [&] { on(plain, call); }, 0.2, 5);
      const double bytes = 2.0 * x.nbytes();
      report.add({"rpc", big, bytes / t / 1e9, "GB/s", anchor, bytes / r / 1e9});
    }
  }
  if (report.wants("rpc", setup)) {
    // A new pair of agents each time; only the first call, which opens the connection, is timed.
    auto first_call = [](const Security& how) {
      Pair p(how);
      gw::rpc::Agent::Use use(*p.a);
      const auto start = std::chrono::steady_clock::now();
      gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2));
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    constexpr int kRounds = 21;
    std::vector<double> safe, plain;
    for (int i = 0; i < kRounds; ++i) {
      safe.push_back(first_call(secured));
      plain.push_back(first_call({}));
    }
    std::ranges::nth_element(safe, safe.begin() + kRounds / 2);
    std::ranges::nth_element(plain, plain.begin() + kRounds / 2);
    report.add({"rpc", setup, safe[kRounds / 2] * 1e6, "us", anchor, plain[kRounds / 2] * 1e6,
                "median of 21"});
  }
}

// Shared memory against loopback TCP, two pairs of agents in this process (interleaved rounds),
// and each tensor round trip against memcpy of the same bytes: the round trip moves them there
// and back, so its anchor is the rate of two copies.
void bench_shm(Reporter& report) {
  const char* small = "rpc_sync small over shared memory";
  auto big = [](int64_t mib) {
    return "tensor round trip " + std::to_string(mib) + " MiB over shared memory";
  };
  bool any = report.wants("rpc", small);
  for (int64_t mib : {1, 16, 64}) any = any || report.wants("rpc", big(mib));
  if (!any) return;
  Pair shm({{}, {}, true}), tcp;
  auto on = [](Pair& p, auto f) {
    gw::rpc::Agent::Use use(*p.a);
    f();
  };
  on(shm, [] { gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2); });
  if (shm.a->link(1) != "shm") {
    report.skip("rpc", "over shared memory", "the agents did not agree on shared memory here");
    return;
  }
  const char* anchor = "a second pair over loopback tcp, same run";
  if (report.wants("rpc", small)) {
    auto call = [] { gw::bench::do_not_optimize(gw::rpc::rpc_sync<int64_t>(1, "min", 1, 2)); };
    auto [t, r] = gw::bench::seconds_per_call_pair([&] { on(shm, call); }, [&] { on(tcp, call); });
    report.add({"rpc", small, t * 1e6, "us", anchor, r * 1e6});
  }
  for (int64_t mib : {1, 16, 64}) {
    if (!report.wants("rpc", big(mib))) continue;
    gw::Tensor x = gw::ones({mib << 18});
    std::vector<uint8_t> copy(x.nbytes());
    auto call = [&] { gw::bench::do_not_optimize(gw::rpc::rpc_sync(1, echo, x)); };
    auto [t, r] =
        gw::bench::seconds_per_call_pair([&] { on(shm, call); }, [&] { on(tcp, call); }, 0.2, 5);
    const double bytes = 2.0 * x.nbytes();
    report.add({"rpc", big(mib), bytes / t / 1e9, "GB/s", anchor, bytes / r / 1e9});
    auto [t2, m] =
        gw::bench::seconds_per_call_pair([&] { on(shm, call); },
                                         [&] {
                                           std::memcpy(copy.data(), x.raw_data(), x.nbytes());
                                           gw::bench::do_not_optimize(copy.data());
                                           std::memcpy(copy.data(), x.raw_data(), x.nbytes());
                                           gw::bench::do_not_optimize(copy.data());
                                         },
                                         0.2, 5);
    report.add({"rpc", big(mib), bytes / t2 / 1e9, "GB/s", "memcpy of the same bytes, twice",
                bytes / m / 1e9});
  }
}

// A world of n processes under gwrun running rpc_basics (init_rpc, worker0's calls, graceful
// shutdown), timed from gwrun's start to its exit: median of 3. Against linear growth from the
// 64-process world: a ratio below 1 means growing faster than linearly. GW_BENCH_WORLD_GWRUN and
// GW_BENCH_WORLD_PROGRAM time another build's binaries.
// What one rpc_basics worker needs at its peak, with room to spare: on a 23 GiB machine the
// kernel killed workers of a 256-process world holding 96 MB each.
constexpr double kWorldBytesPerProcess = 128.0 * (1 << 20);

// The memory the kernel says it can hand out without swapping (MemAvailable), in bytes.
std::optional<double> memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(256, '\n');
  }
  return std::nullopt;
}

void bench_world(Reporter& report) {
  auto name_of = [](int n) {
    return "world start-up + shutdown, " + std::to_string(n) + " processes";
  };
  // The 64-process world is every row's base: it runs when any of them is wanted.
  if (!std::ranges::any_of(std::array{64, 256, 512},
                           [&](int n) { return report.wants("rpc", name_of(n)); }))
    return;
  const std::string dir = gw::bench::executable_dir();
  auto from_env = [](const char* name, std::string fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::string(v) : fallback;
  };
  const std::string gwrun = from_env("GW_BENCH_WORLD_GWRUN", dir + "/../tools/gwrun/gwrun");
  const std::string program = from_env("GW_BENCH_WORLD_PROGRAM", dir + "/../examples/rpc_basics");
  auto seconds = [&](int n) -> std::optional<double> {
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) {
      const auto start = std::chrono::steady_clock::now();
      if (!gw::bench::run_capture(gwrun + " --nproc-per-node " + std::to_string(n) + " " + program +
                                  " 2>/dev/null"))
        return std::nullopt;
      runs.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::ranges::sort(runs);
    return runs[1];
  };
  std::optional<double> base;
  for (const int n : {64, 256, 512}) {
    const std::string name = name_of(n);
    if (!report.wants("rpc", name) && n != 64) continue;
    const double needed = n * kWorldBytesPerProcess;
    if (const auto available = memory_available(); available && *available < needed) {
      report.skip("rpc", name,
                  "needs about " + std::to_string(static_cast<int>(std::ceil(needed / (1 << 30)))) +
                      " GiB, " + std::to_string(static_cast<int>(*available / (1 << 30))) +
                      " GiB available");
      continue;
    }
    const auto t = seconds(n);
    if (!t) {
      report.skip("rpc", name, "gwrun " + program + " failed (too many processes here?)");
      continue;
    }
    if (n == 64) base = t;
    if (!base || !report.wants("rpc", name)) continue;
    report.add({"rpc", name, *t, "s", "linear growth from 64 processes, same run", *base * n / 64.0,
                "median of 3"});
  }
}

}  // namespace

int main(int argc, char** argv) {
  Reporter report(argc, argv);
  // PyTorch runs first, on its own: its two processes would otherwise share the cores with
  // the cases measured here.
  bool any = report.wants("rpc", kSmall) || report.wants("rpc", kAsync);
  for (int64_t mib : {1, 16, 64}) any = any || report.wants("rpc", tensor_case(mib));
  TorchAnchor torch = any ? run_torch_anchor() : TorchAnchor{};
  {
    Pair p;
    gw::rpc::Agent::Use use(*p.a);
    bench_small(report, torch);
    bench_traced(report);
    bench_async(report, torch);
    bench_remote(report);
    bench_tensors(report, torch);
  }
  bench_security(report, "authenticated", {gw::store::JobKey::generate(), {}});
  gw::test::Pki pki;  // a throwaway CA for the TLS rows
  bench_security(report, "TLS", {gw::store::JobKey::generate(), pki.issue("bench")});
  bench_shm(report);
  bench_world(report);
  return 0;
}
