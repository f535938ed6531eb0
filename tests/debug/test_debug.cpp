// The flight recorder, the progress file and the hang doctor's reading of dumps; the recording
// done by real Gloo groups and RPC agents (threads as ranks); GW_DISTRIBUTED_DEBUG=DETAIL's
// check and monitored_barrier.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/ops.h"
#include "debug/doctor.h"
#include "debug/flight_recorder.h"
#include "debug/progress.h"
#include "dist/process_group/debug_process_group.h"
#include "dist/process_group/process_group_gloo.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "tests/temp_dir.h"

using nlohmann::json;
namespace debug = gw::debug;
namespace dist = gw::dist;

namespace {

json info() { return json::parse(debug::get_debug_info()); }

// The recorded event with this id.
json event(uint64_t id) {
  const json all = info();  // not a temporary: the loop runs over a part of it
  for (const auto& e : all["events"])
    if (e["id"] == id) return e;
  return nullptr;
}

// The newest collective event of `group` with op `op`.
json last_collective(const std::string& group, const std::string& op) {
  json found;
  const json all = info();
  for (const auto& e : all["events"])
    if (e["kind"] == "collective" && e["group"] == group && e["op"] == op) found = e;
  return found;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// A dump as a rank writes it, with `events` and `sections`.
std::string dump(int rank, json events, json sections = json::object()) {
  return json{{"rank", rank}, {"events", events}, {"sections", sections}}.dump();
}

// Recorded in the order made (the recorder's ids grow).
json collective(const std::string& op, int64_t seq, const std::string& detail,
                const std::string& state = "started") {
  static uint64_t next_id = 1;
  return {{"id", next_id++}, {"kind", "collective"}, {"group", "default_pg"}, {"op", op},
          {"seq", seq},      {"detail", detail},     {"state", state},        {"age_ms", 2500.0}};
}

}  // namespace

TEST_CASE("the flight recorder keeps each event's state and the error it failed with",
          "[flight_recorder]") {
  const uint64_t ok = debug::record({.kind = debug::Kind::kCollective,
                                     .group = "g",
                                     .seq = 7,
                                     .op = "allreduce",
                                     .detail = "[4] float32"});
  const uint64_t bad = debug::record({.kind = debug::Kind::kRpcCall,
                                      .group = "worker0",
                                      .op = "call of 'f'",
                                      .detail = "",
                                      .peer = 1});
  REQUIRE(ok != 0);
  CHECK(event(ok)["state"] == "started");
  debug::update(ok, debug::State::kCompleted);
  debug::finish(bad, std::make_exception_ptr(gw::IoError("peer gone\nsecond line")));
  json a = event(ok), b = event(bad);
  CHECK(a["state"] == "completed");
  CHECK(a["seq"] == 7);
  CHECK(a["detail"] == "[4] float32");
  CHECK(a["finished_us"].get<int64_t>() >= a["started_us"].get<int64_t>());
  CHECK(b["state"] == "failed");
  CHECK(b["kind"] == "rpc_call");
  CHECK(b["peer"] == 1);
  CHECK(b["error"] == "peer gone");  // the first line only
  // An event that ended stays ended: a collective an abort failed before its start was marked.
  debug::update(bad, debug::State::kStarted);
  CHECK(event(bad)["state"] == "failed");
  CHECK(event(bad)["error"] == "peer gone");
}

TEST_CASE("the flight recorder is a bounded ring: the oldest events go first",
          "[flight_recorder]") {
  const size_t capacity = info()["capacity"].get<size_t>();
  REQUIRE(capacity > 0);
  uint64_t first = 0, last = 0;
  for (size_t i = 0; i < capacity + 10; ++i) {
    const std::string op = "op" + std::to_string(i);
    last = debug::record({.group = "ring", .op = op, .detail = ""});
    if (i == 0) first = last;
  }
  json events = info()["events"];
  CHECK(events.size() == capacity);
  CHECK(events.back()["id"] == last);
  CHECK(events.front()["id"] == last - capacity + 1);
  debug::update(first, debug::State::kCompleted);  // overwritten: ignored
  CHECK(event(first).is_null());
}

TEST_CASE("a debug section shows while its handle lives", "[flight_recorder]") {
  {
    debug::Section section("probe", [] { return std::string(R"({"answer": 42})"); });
    CHECK(info()["sections"]["probe"][0]["answer"] == 42);
  }
  CHECK_FALSE(info()["sections"].contains("probe"));
}

TEST_CASE("dump_now writes the debug info to GW_DEBUG_DUMP_DIR", "[flight_recorder]") {
  gw::test::TempDir dir;
  ::setenv("GW_DEBUG_DUMP_DIR", dir.path.c_str(), 1);
  const std::string path = debug::dump_now("asked by the test");
  ::unsetenv("GW_DEBUG_DUMP_DIR");
  CHECK(std::filesystem::path(path).parent_path() == dir.path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str());
  CHECK(j["reason"] == "asked by the test");
  CHECK(j["pid"] == static_cast<int64_t>(::getpid()));
}

TEST_CASE("SIGUSR1 makes a process dump its debug info", "[flight_recorder]") {
  gw::test::TempDir dir;
  ::setenv("GW_DEBUG_DUMP_DIR", dir.path.c_str(), 1);
  debug::dump_on_sigusr1();
  const std::string path = debug::dump_path();
  REQUIRE(::raise(SIGUSR1) == 0);  // the process lives on: the handler only wakes a thread
  // The file appears whole (written aside, then renamed): bounded wait for the thread.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::unsetenv("GW_DEBUG_DUMP_DIR");
  REQUIRE(std::filesystem::exists(path));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(debug::dump_reason(text.str()) == "SIGUSR1");
}

TEST_CASE("a progress file is shared between its two sides", "[flight_recorder]") {
  gw::test::TempDir dir;
  const std::string path = dir.path + "/progress.0";
  auto launcher = debug::ProgressFile::create(path);
  auto worker = debug::ProgressFile::open(path);
  CHECK(launcher->read() == debug::ProgressCounts{});
  worker->started();
  worker->started();
  worker->finished();
  CHECK(launcher->read() == debug::ProgressCounts{2, 1});
  CHECK(launcher->read().pending());
  CHECK_THROWS_WITH(debug::ProgressFile::open(dir.path + "/absent"),
                    Catch::Contains("cannot open") && Catch::Contains("absent"));
}

TEST_CASE("the doctor names the ranks in a different collective", "[hang_doctor]") {
  std::map<int, debug::RankDump> dumps;
  for (int r : {0, 2})
    dumps[r] = {dump(r, {collective("allreduce", 56, "[4096] float32", "completed"),
                         collective("broadcast", 57, "[4096] float32 root 0")}),
                ""};
  dumps[1] = {dump(1, {collective("allreduce", 56, "[4096] float32", "completed"),
                       collective("allreduce", 57, "[4096] float32")}),
              ""};
  const std::string text = joined(debug::diagnose(dumps));
  INFO(text);
  CHECK(text.find("collectives on default_pg: rank 1 is in allreduce #57 [4096] float32 while "
                  "ranks 0, 2 are in broadcast #57 [4096] float32 root 0") != std::string::npos);
}

TEST_CASE("the doctor names a rank behind the others, and a silent one", "[hang_doctor]") {
  std::map<int, debug::RankDump> dumps;
  dumps[0] = {dump(0, {collective("allreduce", 3, "[4] float32")}), ""};
  dumps[1] = {dump(1, {collective("allreduce", 2, "[4] float32", "completed")}), ""};
  dumps[2] = {std::nullopt, "sent no debug info within 5 s"};
  dumps[3] = {dump(3, json::array()), ""};
  const std::string text = joined(debug::diagnose(dumps));
  INFO(text);
  CHECK(text.find("rank 0 is in allreduce #3 [4] float32") != std::string::npos);
  CHECK(text.find("rank 1 has not called #3; its last was allreduce #2 [4] float32 (completed)") !=
        std::string::npos);
  CHECK(text.find("rank 2 sent no debug info within 5 s") != std::string::npos);
  CHECK(text.find("rank 3 has not called #3; it has called no collective") != std::string::npos);
}

TEST_CASE("the doctor finds a cycle of RPCs through busy pools", "[hang_doctor]") {
  std::map<int, debug::RankDump> dumps;
  for (int r = 0; r < 3; ++r) {
    json agent = {{"worker", "worker" + std::to_string(r)},
                  {"threads", 1},
                  {"busy", 1},
                  {"queued", 1},
                  {"pending_calls",
                   {{{"to", "worker" + std::to_string((r + 1) % 3)},
                     {"what", "call of 'relay'"},
                     {"age_ms", 3000.0}}}}};
    dumps[r] = {dump(r, json::array(), {{"rpc", {agent}}}), ""};
  }
  const std::string text = joined(debug::diagnose(dumps));
  INFO(text);
  CHECK(text.find("rpc: worker0 → worker1 → worker2 → worker0: every worker's pool is busy") !=
        std::string::npos);
  CHECK(count_if(text.begin(), text.end(), [](char c) { return c == '\n'; }) == 1);
}

TEST_CASE("the doctor has nothing to say about a job that waits on nothing", "[hang_doctor]") {
  std::map<int, debug::RankDump> dumps;
  dumps[0] = {dump(0, {collective("allreduce", 1, "[4] float32", "completed")}), ""};
  dumps[1] = {dump(1, {collective("allreduce", 1, "[4] float32", "completed")}), ""};
  CHECK(debug::diagnose(dumps) == std::vector<std::string>{"no rank is waiting on another"});
  dumps[1] = {std::string("{not json"), ""};
  CHECK(joined(debug::diagnose(dumps)).find("rank 1's debug info does not parse") !=
        std::string::npos);
}

namespace {

// Runs fn(group, rank) on `n` Gloo ranks (threads) over one store; returns each rank's error.
std::vector<std::string> on_ranks(int n, const std::function<void(dist::ProcessGroup&, int)>& fn,
                                  bool detail, const std::string& name = "test_group") {
  auto store = std::make_shared<gw::store::HashStore>();
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r]() -> std::string {
      try {
        auto gloo = std::make_shared<dist::ProcessGroupGloo>(
            store, r, n,
            dist::GlooOptions{.timeout = std::chrono::seconds(20), .group_name = name});
        std::shared_ptr<dist::ProcessGroup> group = gloo;
        if (detail)
          group = std::make_shared<dist::DebugProcessGroup>(
              gloo, std::make_shared<gw::store::PrefixStore>("gw_debug", store),
              std::chrono::seconds(5));
        fn(*group, r);
        return "";
      } catch (const std::exception& e) {
        return e.what();
      }
    }));
  std::vector<std::string> errors;
  for (auto& f : ranks) errors.push_back(f.get());
  return errors;
}

}  // namespace

TEST_CASE("a Gloo group records its collectives, numbered, with their signatures",
          "[flight_recorder]") {
  auto errors = on_ranks(
      2,
      [](dist::ProcessGroup& pg, int) {
        gw::Tensor t = gw::ones({2, 3});
        pg.allreduce(t, {.op = dist::ReduceOp::MAX})->wait();
        pg.broadcast(t, {.root = 1})->wait();
      },
      false, "recorded_group");
  CHECK(errors == std::vector<std::string>{"", ""});
  json a = last_collective("recorded_group", "allreduce");
  json b = last_collective("recorded_group", "broadcast");
  REQUIRE(!a.is_null());
  REQUIRE(!b.is_null());
  CHECK(a["detail"] == "[2, 3] float32 MAX");
  CHECK(a["state"] == "completed");
  CHECK(b["detail"] == "[2, 3] float32 root 1");
  CHECK(b["seq"].get<int64_t>() == a["seq"].get<int64_t>() + 1);
}

TEST_CASE("DETAIL raises on every rank for different shapes, naming both", "[detail]") {
  auto errors = on_ranks(
      3,
      [](dist::ProcessGroup& pg, int rank) {
        gw::Tensor ok = gw::ones({4});
        pg.allreduce(ok)->wait();  // the same everywhere: passes
        gw::Tensor t = gw::ones({rank == 2 ? 5 : 4});
        pg.allreduce(t)->wait();
      },
      true);
  for (const auto& e : errors)
    CHECK(e ==
          "[allreduce] GW_DISTRIBUTED_DEBUG=DETAIL: collective #2 differs across ranks: "
          "rank 0 calls allreduce [4] float32 but rank 2 calls allreduce [5] float32");
}

TEST_CASE("DETAIL raises for different collectives and different roots", "[detail]") {
  auto errors = on_ranks(
      2,
      [](dist::ProcessGroup& pg, int rank) {
        gw::Tensor t = gw::ones({4});
        if (rank == 0)
          pg.broadcast(t, {.root = 0})->wait();
        else
          pg.broadcast(t, {.root = 1})->wait();
      },
      true);
  for (const auto& e : errors)
    CHECK(e.find("rank 0 calls broadcast [4] float32 root 0 but rank 1 calls broadcast [4] "
                 "float32 root 1") != std::string::npos);
}

TEST_CASE("DETAIL names a rank that never reaches the collective", "[detail]") {
  auto errors = on_ranks(
      2,
      [](dist::ProcessGroup& pg, int rank) {
        if (rank == 1) return;  // never calls it
        gw::Tensor t = gw::ones({4});
        pg.allreduce(t, {.timeout = std::chrono::milliseconds(300)})->wait();
      },
      true);
  CHECK(errors[0] ==
        "[allreduce] GW_DISTRIBUTED_DEBUG=DETAIL: rank 1 did not reach "
        "collective #1 within 300 ms; rank 0 is in allreduce [4] float32");
  CHECK(errors[1].empty());
}

TEST_CASE("monitored_barrier passes when all come and names those who do not", "[detail]") {
  auto errors = on_ranks(
      3,
      [](dist::ProcessGroup& pg, int rank) {
        pg.monitored_barrier(std::chrono::seconds(10));  // everyone
        pg.monitored_barrier(std::chrono::seconds(10));  // again: keys of its own
        if (rank == 1) return;
        pg.monitored_barrier(std::chrono::milliseconds(300));
      },
      false);
  CHECK(errors[0] ==
        "[monitored_barrier] rank 1 did not arrive within 300 ms (barrier #3, "
        "rank 0 of 3)");
  CHECK(errors[1].empty());
  CHECK(errors[2] ==
        "[monitored_barrier] rank 1 did not arrive within 300 ms (barrier #3, "
        "rank 2 of 3)");
  auto bad = on_ranks(
      1, [](dist::ProcessGroup& pg, int) { pg.monitored_barrier(std::chrono::milliseconds(0)); },
      false);
  CHECK(bad[0] == "[monitored_barrier] the timeout must be positive, got 0 ms");
}

TEST_CASE("GW_DISTRIBUTED_DEBUG takes OFF, INFO or DETAIL only", "[detail]") {
  ::setenv("GW_DISTRIBUTED_DEBUG", "LOUD", 1);
  CHECK_THROWS_WITH(
      dist::distributed_debug_level(),
      Catch::Contains("GW_DISTRIBUTED_DEBUG must be OFF, INFO or DETAIL, got 'LOUD'"));
  ::setenv("GW_DISTRIBUTED_DEBUG", "DETAIL", 1);
  CHECK(dist::distributed_debug_level() == dist::DebugLevel::kDetail);
  ::unsetenv("GW_DISTRIBUTED_DEBUG");
  CHECK(dist::distributed_debug_level() == dist::DebugLevel::kOff);
}

namespace {
std::promise<void>* g_started = nullptr;  // set by the test before the call
std::shared_future<void> g_released;
int64_t held_call(int64_t x) {
  g_started->set_value();
  g_released.wait();
  return x;
}
GW_RPC_FUNCTION(held_call);
}  // namespace

TEST_CASE("an RPC agent shows its pending calls and its busy pool", "[flight_recorder]") {
  std::promise<void> started, release;
  g_started = &started;
  g_released = release.get_future().share();
  auto store = std::make_shared<gw::store::HashStore>();
  auto make = [&](int rank) {
    gw::rpc::RpcBackendOptions o;
    o.store = store;
    o.num_worker_threads = 1;
    return std::make_unique<gw::rpc::Agent>("dbg" + std::to_string(rank), rank, 2, o);
  };
  auto f1 = std::async(std::launch::async, make, 1);
  auto a0 = make(0);
  auto a1 = f1.get();
  auto call = a0->call("dbg1", "held_call", {gw::rpc::IValue(int64_t{5})});
  // Bounded: the handler runs at once, or the call fails after the default RPC timeout.
  REQUIRE(started.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  json caller, callee;
  const json all = info();
  for (const auto& a : all["sections"]["rpc"]) (a["worker"] == "dbg0" ? caller : callee) = a;
  release.set_value();
  CHECK(call.wait().to_int() == 5);
  REQUIRE(caller["pending_calls"].size() == 1);
  CHECK(caller["pending_calls"][0]["to"] == "dbg1");
  CHECK(caller["pending_calls"][0]["what"] == "call of 'held_call'");
  CHECK(callee["busy"] == 1);
  CHECK(callee["threads"] == 1);
  CHECK(callee["serving"]["dbg0"] == 1);
  auto stop1 = std::async(std::launch::async, [&] { a1->shutdown(); });
  a0->shutdown();
  stop1.get();
}
