// ProcessGroupGloo allreduce: latency and bus bandwidth from 4 B to 64 MiB with two ranks as
// threads of this process, beside raw Gloo doing the same allreduce over 127.0.0.1 (the same
// ring algorithm on a Gloo context made directly, no ProcessGroup, no Work) in the same run,
// and beside PyTorch 1.13's torch.distributed.all_reduce over its gloo backend (two processes,
// torch_anchor_allreduce.py). The group's allreduce goes through shared memory, as it does for
// any ranks on one host (dist/process_group/shm_collectives.h); the rows marked "TCP" turn that
// off (GlooOptions::shared_memory) and measure the group on Gloo's own allreduce. Bus bandwidth
// is bytes * 2 (n - 1) / n per second, as nccl-tests counts it.
//
// Then the flat collectives sharded data parallelism runs on, at 4 ranks (threads, so through
// shared memory): reduce_scatter_tensor beside raw Gloo's own reduce-scatter
// (ReduceScatterHalvingDoubling, an algorithm object made once, in place) and
// all_gather_into_tensor beside raw gloo::allgather.
// Bus bandwidth of both: whole buffer * (n - 1) / n per second. PyTorch 1.13's Gloo backend
// has no reduce_scatter, so no PyTorch row.
//
// And point to point, what pipelines run on: a send/recv ping-pong of 4 B and 1 MiB between two
// ranks (threads), beside the same ping-pong on raw Gloo's unbound buffers.
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include "bench/harness.h"
#include "core/ops.h"
#include "dist/process_group/process_group_gloo.h"
#include "store/hash_store.h"

namespace {

constexpr int kRanks = 2;

struct Case {
  size_t bytes;
  int iters;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (size_t bytes : {size_t{4}, size_t{4} << 10, size_t{256} << 10, size_t{4} << 20,
                       size_t{64} << 20}) {
    // About 64 MiB moved per round, at least 4 and at most 500 iterations.
    int iters = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 4, 500));
    out.push_back({bytes, iters});
  }
  return out;
}

// One timed loop of `iters` calls after a warm-up; the first call lines the ranks up.
template <typename Op>
double loop(int iters, Op op) {
  for (int i = 0; i < 3; ++i) op();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

struct Times {
  // Best seconds per allreduce over the rounds: gradwire as it comes (shared memory, run on the
  // waiting thread since abort() wakes it), with liveness off (failure_timeout 0: no liveness
  // thread beside it), on Gloo's TCP allreduce (liveness on, so on the group's thread), raw
  // Gloo.
  double gradwire = 1e30, unwatched = 1e30, tcp = 1e30, raw = 1e30;
};

// Both ranks run, in alternating rounds, the ProcessGroupGloo allreduce and the raw Gloo one,
// so that a busy moment on the machine hits both alike; rank 0's best of each is returned.
Times measure(const Case& c, int rounds = 5) {
  auto store = std::make_shared<gw::store::HashStore>();
  auto unwatched_store = std::make_shared<gw::store::HashStore>();
  auto tcp_store = std::make_shared<gw::store::HashStore>();
  gloo::rendezvous::HashStore raw_store;
  auto rank_main = [&](int rank) {
    gw::dist::ProcessGroupGloo pg(store, rank, kRanks);
    gw::dist::ProcessGroupGloo unwatched(unwatched_store, rank, kRanks,
                                         {.failure_timeout = std::chrono::milliseconds(0)});
    gw::dist::ProcessGroupGloo tcp(tcp_store, rank, kRanks, {.shared_memory = false});
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, kRanks);
    context->connectFullMesh(raw_store, device);
    const size_t n = std::max<size_t>(c.bytes / 4, 1);
    gw::Tensor t = gw::ones({static_cast<int64_t>(n)});
    std::vector<float> data(n, 1.f);
    uint32_t tag = 0;
    auto raw_allreduce = [&] {
      gloo::AllreduceOptions o(context);
      o.setOutput<float>(data.data(), data.size());
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTag(tag++);
      gloo::allreduce(o);
    };
    Times best;
    for (int round = 0; round < rounds; ++round) {
      best.gradwire = std::min(best.gradwire, loop(c.iters, [&] { pg.allreduce(t)->wait(); }));
      best.unwatched =
          std::min(best.unwatched, loop(c.iters, [&] { unwatched.allreduce(t)->wait(); }));
      best.tcp = std::min(best.tcp, loop(c.iters, [&] { tcp.allreduce(t)->wait(); }));
      best.raw = std::min(best.raw, loop(c.iters, raw_allreduce));
    }
    return best;
  };
  std::vector<std::future<Times>> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(std::async(std::launch::async, rank_main, r));
  Times rank0 = ranks[0].get();
  for (int r = 1; r < kRanks; ++r) ranks[r].get();
  return rank0;
}

constexpr int kFlatRanks = 4;

struct FlatTimes {
  double reduce_scatter = 1e30, raw_reduce_scatter = 1e30, all_gather = 1e30, raw_all_gather = 1e30;
};

// `bytes`: the whole buffer (kFlatRanks chunks). Alternating rounds, rank 0's best of each.
FlatTimes measure_flat(size_t bytes, int iters, int rounds = 5) {
  auto store = std::make_shared<gw::store::HashStore>();
  gloo::rendezvous::HashStore raw_store;
  auto rank_main = [&](int rank) {
    gw::dist::ProcessGroupGloo pg(store, rank, kFlatRanks);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, kFlatRanks);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context->connectFullMesh(raw_store, device);
    const int64_t chunk = static_cast<int64_t>(bytes / 4 / kFlatRanks);
    gw::Tensor whole = gw::ones({chunk * kFlatRanks});
    gw::Tensor mine = gw::ones({chunk});
    std::vector<float> raw(static_cast<size_t>(chunk * kFlatRanks), 1.f);
    gloo::ReduceScatterHalvingDoubling<float> raw_rs(
        context, {raw.data()}, static_cast<int>(raw.size()),
        std::vector<int>(kFlatRanks, static_cast<int>(chunk)));
    std::vector<float> raw_in(static_cast<size_t>(chunk), 1.f);
    uint32_t tag = 0;
    auto raw_allgather = [&] {
      gloo::AllgatherOptions o(context);
      o.setInput<float>(raw_in.data(), raw_in.size());
      o.setOutput<float>(raw.data(), raw.size());
      o.setTag(tag++);
      gloo::allgather(o);
    };
    FlatTimes best;
    for (int round = 0; round < rounds; ++round) {
      best.reduce_scatter = std::min(
          best.reduce_scatter, loop(iters, [&] { pg.reduce_scatter_tensor(mine, whole)->wait(); }));
      best.raw_reduce_scatter =
          std::min(best.raw_reduce_scatter, loop(iters, [&] { raw_rs.run(); }));
      best.all_gather = std::min(
          best.all_gather, loop(iters, [&] { pg.all_gather_into_tensor(whole, mine)->wait(); }));
      best.raw_all_gather = std::min(best.raw_all_gather, loop(iters, raw_allgather));
    }
    return best;
  };
  std::vector<std::future<FlatTimes>> ranks;
  for (int r = 0; r < kFlatRanks; ++r)
    ranks.push_back(std::async(std::launch::async, rank_main, r));
  FlatTimes rank0 = ranks[0].get();
  for (int r = 1; r < kFlatRanks; ++r) ranks[r].get();
  return rank0;
}

struct P2PTimes {
  double gradwire = 1e30, raw = 1e30;  // one round trip
};

P2PTimes measure_p2p(size_t bytes, int iters, int rounds = 5) {
  auto store = std::make_shared<gw::store::HashStore>();
  gloo::rendezvous::HashStore raw_store;
  auto rank_main = [&](int rank) {
    gw::dist::ProcessGroupGloo pg(store, rank, 2);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context->connectFullMesh(raw_store, device);
    gw::Tensor t = gw::ones({static_cast<int64_t>(bytes / 4)});
    std::vector<float> raw(bytes / 4, 1.f);
    auto buf = context->createUnboundBuffer(raw.data(), bytes);
    const int peer = 1 - rank;
    auto ours = [&] {
      if (rank == 0) pg.send(t, peer, 7)->wait();
      pg.recv(t, peer, 7)->wait();
      if (rank == 1) pg.send(t, peer, 7)->wait();
    };
    auto raw_ping_pong = [&] {
      if (rank == 0) {
        buf->send(peer, 7);
        buf->waitSend();
      }
      buf->recv(peer, 7);
      buf->waitRecv();
      if (rank == 1) {
        buf->send(peer, 7);
        buf->waitSend();
      }
    };
    P2PTimes best;
    for (int round = 0; round < rounds; ++round) {
      best.gradwire = std::min(best.gradwire, loop(iters, ours));
      best.raw = std::min(best.raw, loop(iters, raw_ping_pong));
    }
    return best;
  };
  auto other = std::async(std::launch::async, rank_main, 1);
  P2PTimes rank0 = rank_main(0);
  other.get();
  return rank0;
}

void report_p2p(gw::bench::Reporter& report) {
  for (size_t bytes : {size_t{4}, size_t{1} << 20}) {
    const std::string name = "send/recv ping-pong " + gw::bench::size_label(bytes) + ", 2 ranks";
    if (!report.wants("process_group", name)) continue;
    const P2PTimes t = measure_p2p(bytes, bytes > 4096 ? 50 : 200);
    report.add({"process_group", name, t.gradwire * 1e6, "us", "raw gloo unbound buffers",
                t.raw * 1e6, "one round trip, best of 5"});
  }
}

void report_flat(gw::bench::Reporter& report) {
  for (size_t bytes : {size_t{4} << 20, size_t{64} << 20}) {
    const std::string size = gw::bench::size_label(bytes) + ", 4 ranks";
    const bool rs = report.wants("process_group", "reduce_scatter_tensor " + size);
    const bool ag = report.wants("process_group", "all_gather_into_tensor " + size);
    if (!rs && !ag) continue;
    const int iters = bytes > (size_t{8} << 20) ? 4 : 20;
    const FlatTimes t = measure_flat(bytes, iters);
    const double bus = static_cast<double>(bytes) * (kFlatRanks - 1) / kFlatRanks / 1e9;
    if (rs)
      report.add({"process_group", "reduce_scatter_tensor " + size, bus / t.reduce_scatter, "GB/s",
                  "raw gloo halving-doubling", bus / t.raw_reduce_scatter});
    if (ag)
      report.add({"process_group", "all_gather_into_tensor " + size, bus / t.all_gather, "GB/s",
                  "raw gloo allgather", bus / t.raw_all_gather});
  }
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  report_p2p(report);
  report_flat(report);
  std::vector<Case> wanted;
  for (const auto& c : cases())
    if (report.wants("process_group", "allreduce " + gw::bench::size_label(c.bytes)))
      wanted.push_back(c);
  if (wanted.empty()) return 0;

  std::string args;
  for (const auto& c : wanted) args += " " + std::to_string(c.bytes) + ":" + std::to_string(c.iters);
  auto torch = gw::bench::run_capture("timeout -k 5 300 /usr/bin/python3 " +
                                      gw::bench::executable_dir() +
                                      "/torch_anchor_allreduce.py" + args + " 2>/dev/null");

  for (const auto& c : wanted) {
    const Times times = measure(c);
    const double ours = times.gradwire, raw = times.raw;
    const std::string name = "allreduce " + gw::bench::size_label(c.bytes);
    const double bus = static_cast<double>(c.bytes) * 2.0 * (kRanks - 1) / kRanks / 1e9;
    if (c.bytes <= (size_t{4} << 10)) {
      report.add({"process_group", name, ours * 1e6, "us", "raw gloo", raw * 1e6});
      report.add({"process_group", name, ours * 1e6, "us", "gradwire, liveness off",
                  times.unwatched * 1e6});
      report.add({"process_group", name + ", TCP", times.tcp * 1e6, "us", "raw gloo", raw * 1e6});
    } else {
      report.add({"process_group", name, bus / ours, "GB/s", "raw gloo", bus / raw});
      report.add({"process_group", name + ", TCP", bus / times.tcp, "GB/s", "raw gloo", bus / raw});
    }
    auto t = torch ? gw::bench::json_number(*torch, "allreduce_" + std::to_string(c.bytes) + "_us")
                   : std::nullopt;
    if (t) {
      if (c.bytes <= (size_t{4} << 10))
        report.add({"process_group", name, ours * 1e6, "us", "pytorch gloo", *t});
      else
        report.add({"process_group", name, bus / ours, "GB/s", "pytorch gloo", bus / (*t / 1e6)});
    }
  }
  return 0;
}
