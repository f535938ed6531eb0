// Timelines (core/trace.h) of real distributed runs, parsed and checked: a DDP run of two steps
// on two ranks (ddp_train --trace), the parameter server under gwrun with GW_TRACE (gwrun
// merges the ranks' files), and a zero-bubble pipeline's stages (gpt_train --pp --trace).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/gwrun/gwrun_process.h"
#include "tests/temp_dir.h"

using nlohmann::json;

namespace {

json load(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

// The spans of rank `pid` in category `cat` (all of them if `name` is empty, else those named
// so).
std::vector<json> spans(const json& trace, int pid, const std::string& cat,
                        const std::string& name = "") {
  std::vector<json> out;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["pid"] == pid && e["cat"] == cat && (name.empty() || e["name"] == name))
      out.push_back(e);
  return out;
}

// Every flow that starts ends exactly once, in another process, and no flow ends unstarted.
void check_flows_matched(const json& trace, size_t at_least) {
  std::map<uint64_t, std::vector<int>> starts, ends;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "s") starts[e["id"].get<uint64_t>()].push_back(e["pid"].get<int>());
    if (e["ph"] == "f") ends[e["id"].get<uint64_t>()].push_back(e["pid"].get<int>());
  }
  CHECK(starts.size() >= at_least);
  CHECK(starts.size() == ends.size());
  for (const auto& [id, pids] : starts) {
    INFO("flow " << id);
    REQUIRE(pids.size() == 1);
    REQUIRE(ends.contains(id));
    REQUIRE(ends[id].size() == 1);
    CHECK(ends[id][0] != pids[0]);
  }
}

}  // namespace

TEST_CASE("ddp_train --trace: two DDP steps on two ranks, buckets reduced inside backward",
          "[examples][trace]") {
  gw::test::TempDir dir;
  const std::string path = dir.path + "/ddp.json";
  // 128 samples, 32 per rank and step: two steps on each of the two ranks.
  auto r = gw::test::run_gwrun({"--nproc-per-node", "2", GW_DDP_EXAMPLE, "--epochs", "1", "--limit",
                                "128", "--target", "0", "--trace", path});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("trace of 2 of 2 ranks written to " + path) != std::string::npos);
  const json trace = load(path);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    const auto backward = spans(trace, rank, "autograd", "backward");
    const auto forward = spans(trace, rank, "ddp", "DDP forward");
    CHECK(backward.size() == 2);
    CHECK(forward.size() == 2);
    const auto collectives = spans(trace, rank, "collective");
    for (const auto& b : backward) {
      const int64_t from = b["ts"], to = from + b["dur"].get<int64_t>();
      size_t inside = 0;  // DDP's bucket allreduces, started while backward ran
      for (const auto& c : collectives)
        if (c["name"].get<std::string>().starts_with("allreduce") && c["ts"] >= from &&
            c["ts"] <= to)
          ++inside;
      CHECK(inside >= 1);
    }
  }
  // Each collective on rank 0 points at the same collective on rank 1.
  check_flows_matched(trace, 4);
  CHECK(spans(trace, 0, "collective").size() == spans(trace, 1, "collective").size());
}

TEST_CASE("GW_TRACE under gwrun: the parameter server's RPCs on both sides, with arrows",
          "[examples][trace]") {
  gw::test::TempDir dir;
  const std::string path = dir.path + "/ps.json";
  ::setenv("GW_TRACE", path.c_str(), 1);
  auto r = gw::test::run_gwrun(
      {"--nproc-per-node", "2", GW_PS_EXAMPLE, "--epochs", "1", "--limit", "256", "--target", "0"});
  ::unsetenv("GW_TRACE");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("[gwrun] the trace of 2 rank(s) is in " + path) != std::string::npos);
  const json trace = load(path);
  // The server calls the trainer; the trainer's steps call the server.
  const auto server = spans(trace, 0, "rpc"), trainer = spans(trace, 1, "rpc");
  auto named = [](const std::vector<json>& v, const std::string& part) {
    return std::count_if(v.begin(), v.end(), [&](const json& e) {
      return e["name"].get<std::string>().find(part) != std::string::npos;
    });
  };
  CHECK(named(server, "to trainer0") >= 1);
  CHECK(named(trainer, "from ps") >= 1);
  CHECK(named(trainer, "to ps") >= 1);
  CHECK(named(server, "from trainer0") >= 1);
  std::set<std::string> processes;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"]);
  CHECK(processes == std::set<std::string>{"rank 0 (ps)", "rank 1 (trainer0)"});
  check_flows_matched(trace, 4);
}

TEST_CASE(
    "gpt_train --pp 2 --schedule zb --trace: each stage's F, I and W on its own track, as many "
    "as the plan has, never overlapping",
    "[examples][trace][pipeline]") {
  gw::test::TempDir dir;
  const std::string path = dir.path + "/pipeline.json";
  constexpr int kSteps = 2, kMicro = 4;
  auto r = gw::test::run_gwrun({"--nproc-per-node",
                                "2",
                                GW_GPT_EXAMPLE,
                                "--width",
                                "16",
                                "--layers",
                                "2",
                                "--heads",
                                "2",
                                "--context",
                                "16",
                                "--batch-size",
                                "8",
                                "--steps",
                                std::to_string(kSteps),
                                "--eval-every",
                                "2",
                                "--eval-batches",
                                "1",
                                "--sample",
                                "0",
                                "--pp",
                                "2",
                                "--schedule",
                                "zb",
                                "--microbatches",
                                std::to_string(kMicro),
                                "--trace",
                                path});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const json trace = load(path);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    // The track this rank's stage runs on.
    int64_t track = -1;
    for (const auto& e : trace["traceEvents"])
      if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == rank &&
          e["args"]["name"] == "pipeline stage " + std::to_string(rank))
        track = e["tid"];
    REQUIRE(track >= 0);
    auto actions = spans(trace, rank, "pipeline");
    std::sort(actions.begin(), actions.end(),
              [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
    REQUIRE(actions.size() == static_cast<size_t>(3 * kMicro * kSteps));  // F, I and W each
    std::map<char, int> seen;
    for (size_t i = 0; i < actions.size(); ++i) {
      const json& a = actions[i];
      CHECK(a["tid"] == track);
      CHECK(a["args"]["stage"] == rank);
      const std::string name = a["name"];
      ++seen[name[0]];
      if (i > 0)  // one action at a time: the gaps are the stage's idle time
        CHECK(a["ts"].get<int64_t>() >=
              actions[i - 1]["ts"].get<int64_t>() + actions[i - 1]["dur"].get<int64_t>());
    }
    CHECK(seen == std::map<char, int>{
                      {'F', kMicro * kSteps}, {'I', kMicro * kSteps}, {'W', kMicro * kSteps}});
  }
}
