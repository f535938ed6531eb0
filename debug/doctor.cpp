#include "debug/doctor.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace gw::debug {

namespace {

using nlohmann::json;

bool pending(const json& e) {
  const std::string s = e.value("state", "");
  return s == "scheduled" || s == "started";
}

std::string seconds(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

// "rank 1" / "ranks 0, 2"
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// "allreduce #57 [4096] float32"
std::string signature(const json& e) {
  std::string s = e.value("op", "?") + " #" + std::to_string(e.value("seq", int64_t{-1}));
  if (const std::string d = e.value("detail", ""); !d.empty()) s += " " + d;
  return s;
}

// Where ranks stand in a collective: "is in" / "are in" while one of them waits in it,
// "failed in" when it failed on all of them, "called" otherwise.
std::string where(const std::vector<json>& events) {
  const bool plural = events.size() > 1;
  if (std::any_of(events.begin(), events.end(), pending)) return plural ? "are in" : "is in";
  if (std::all_of(events.begin(), events.end(),
                  [](const json& e) { return e.value("state", "") == "failed"; }))
    return "failed in";
  return "called";
}

// Collectives: per group, each rank's latest one (the highest sequence number).
// `any_silent`: some rank sent no dump, so none can be said to be missing.
void diagnose_collectives(const std::map<int, json>& dumps, bool any_silent,
                          std::vector<std::string>& out) {
  // group -> rank -> latest collective
  std::map<std::string, std::map<int, json>> latest;
  for (const auto& [rank, d] : dumps)
    for (const auto& e : d.value("events", json::array())) {
      if (e.value("kind", "") != "collective" || e.value("seq", int64_t{-1}) < 0) continue;
      auto& slot = latest[e.value("group", "")][rank];
      // The newest by record, not by number: a group made again numbers from 1.
      if (slot.is_null() || e.value("id", uint64_t{0}) > slot.value("id", uint64_t{0})) slot = e;
    }
  for (const auto& [group, by_rank] : latest) {
    const bool stuck = std::any_of(by_rank.begin(), by_rank.end(), [](const auto& kv) {
      return pending(kv.second) || kv.second.value("state", "") == "failed";
    });
    if (!stuck) continue;
    int64_t top = 0;
    for (const auto& [rank, e] : by_rank) top = std::max(top, e.value("seq", int64_t{0}));
    // At the newest collective: ranks by signature. Behind it: each rank on its own line.
    std::map<std::string, std::vector<int>> at_top;
    std::map<std::string, std::vector<json>> events;  // of each signature at_top
    std::vector<int> behind;
    for (const auto& [rank, e] : by_rank) {
      if (e.value("seq", int64_t{0}) == top) {
        const std::string key = e.value("op", "") + "|" + e.value("detail", "");
        at_top[key].push_back(rank);
        events[key].push_back(e);
      } else {
        behind.push_back(rank);
      }
    }
    // The default group has every rank: one with no collective at all is behind too.
    if (group == "default_pg")
      for (const auto& [rank, d] : dumps)
        if (!by_rank.contains(rank)) behind.push_back(rank);
    std::sort(behind.begin(), behind.end());
    const std::string prefix = "collectives on " + group + ": ";
    if (at_top.size() > 1) {
      std::vector<std::pair<std::string, std::vector<int>>> sides(at_top.begin(), at_top.end());
      std::stable_sort(sides.begin(), sides.end(), [](const auto& a, const auto& b) {
        return a.second.size() < b.second.size();
      });
      std::string line = prefix;
      for (size_t i = 0; i < sides.size(); ++i) {
        const auto& side = events[sides[i].first];
        line += (i ? " while " : "") + ranks_text(sides[i].second) + " " + where(side) + " " +
                signature(side.front());
      }
      out.push_back(line +
                    ": every rank must call the same collectives, in the same order, "
                    "with the same shapes");
    } else {
      const auto& [key, ranks] = *at_top.begin();
      const json& e = events[key].front();
      std::string line = prefix + ranks_text(ranks) + " " + where(events[key]) + " " + signature(e);
      if (pending(e)) line += " (for " + seconds(e.value("age_ms", 0.0)) + ")";
      if (e.value("state", "") == "failed") line += ": " + e.value("error", "");
      if (behind.empty() && !any_silent && pending(e)) line += ", and no rank is missing";
      out.push_back(line);
    }
    for (int rank : behind) {
      std::string line = prefix + "rank " + std::to_string(rank) + " has not called #" +
                         std::to_string(top) + "; ";
      auto it = by_rank.find(rank);
      if (it == by_rank.end())
        line += "it has called no collective on this group";
      else
        line +=
            "its last was " + signature(it->second) + " (" + it->second.value("state", "") + ")";
      out.push_back(line);
    }
  }
}

struct RpcWorker {
  int threads = 0, busy = 0, queued = 0;
  std::vector<json> calls;  // pending
  // Every thread of its pool runs a handler: a request to it waits until one returns.
  bool saturated() const { return threads > 0 && busy >= threads; }
};

constexpr int kMaxRpcLines = 10;

// RPC: a worker whose pool is full and whose handlers wait on calls to another such worker, and
// so on back to the first, is deadlocked. Each such cycle is found once (a depth-first search
// over the saturated workers, O(workers + calls)); then the calls waiting on a full pool or on
// a silent worker.
void diagnose_rpc(const std::map<int, json>& dumps, bool any_silent,
                  std::vector<std::string>& out) {
  std::map<std::string, RpcWorker> workers;
  for (const auto& [rank, d] : dumps) {
    const json sections = d.value("sections", json::object());
    if (!sections.is_object()) continue;
    for (const auto& agent : sections.value("rpc", json::array())) {
      if (!agent.is_object()) continue;
      RpcWorker& w = workers[agent.value("worker", "?")];
      w.threads = agent.value("threads", 0);
      w.busy = agent.value("busy", 0);
      w.queued = agent.value("queued", 0);
      for (const auto& c : agent.value("pending_calls", json::array()))
        if (c.is_object()) w.calls.push_back(c);
    }
  }
  auto saturated = [&](const std::string& name) {
    auto it = workers.find(name);
    return it != workers.end() && it->second.saturated();
  };
  std::map<std::string, std::set<std::string>> edges;  // between saturated workers only
  for (const auto& [name, w] : workers)
    if (w.saturated())
      for (const auto& c : w.calls)
        if (const std::string to = c.value("to", "?"); saturated(to)) edges[name].insert(to);
  enum class Mark { kNew, kOnPath, kDone };
  std::map<std::string, Mark> mark;
  std::vector<std::string> path;
  std::set<std::string> in_cycle;
  int lines = 0;
  std::function<void(const std::string&)> walk = [&](const std::string& at) {
    mark[at] = Mark::kOnPath;
    path.push_back(at);
    for (const auto& next : edges[at]) {
      if (mark[next] == Mark::kOnPath && lines < kMaxRpcLines) {  // back to the path: a cycle
        std::string line = "rpc: ";
        for (auto it = std::find(path.begin(), path.end(), next); it != path.end(); ++it) {
          line += *it + " → ";
          in_cycle.insert(*it);
        }
        out.push_back(line + next +
                      ": every worker's pool is busy waiting on the next (nested blocking RPCs: "
                      "give the pools more threads, or make the calls asynchronous)");
        ++lines;
      } else if (mark[next] == Mark::kNew) {
        walk(next);
      }
    }
    path.pop_back();
    mark[at] = Mark::kDone;
  };
  for (const auto& [name, targets] : edges)
    if (mark[name] == Mark::kNew) walk(name);
  // Other calls waiting on a worker that cannot answer: its pool is full, or it is silent.
  for (const auto& [name, w] : workers) {
    if (in_cycle.contains(name)) continue;
    for (const auto& c : w.calls) {
      const std::string to = c.value("to", "?");
      auto it = workers.find(to);
      std::string why;
      if (it == workers.end() && any_silent)
        why = to + " sent no debug info";
      else if (it != workers.end() && it->second.saturated())
        why = to + "'s pool is busy (" + std::to_string(it->second.busy) + " of " +
              std::to_string(it->second.threads) + " threads, " +
              std::to_string(it->second.queued) + " queued)";
      else
        continue;
      if (++lines > kMaxRpcLines) return;
      out.push_back("rpc: " + name + " waits for " + to + " (" + c.value("what", "?") + ", for " +
                    seconds(c.value("age_ms", 0.0)) + "): " + why);
    }
  }
}

}  // namespace

std::string dump_reason(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j.value("reason", "") : "";
}

std::vector<std::string> diagnose(const std::map<int, RankDump>& dumps) {
  std::vector<std::string> out;
  std::map<int, json> parsed;
  bool any_silent = false;
  for (const auto& [rank, dump] : dumps) {
    if (!dump.json) {
      out.push_back("rank " + std::to_string(rank) + " " +
                    (dump.missing.empty() ? "sent no debug info" : dump.missing));
      any_silent = true;
      continue;
    }
    // Only what has the recorder's shape: an object whose events are objects.
    json j = json::parse(*dump.json, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.value("events", json::array()).is_array()) {
      out.push_back("rank " + std::to_string(rank) + "'s debug info does not parse");
      any_silent = true;
      continue;
    }
    json events = json::array();
    for (auto& e : j.value("events", json::array()))
      if (e.is_object()) events.push_back(std::move(e));
    j["events"] = std::move(events);
    parsed[rank] = std::move(j);
  }
  // A field of an unexpected type throws: one part's failure does not hide the others'.
  for (auto part : {diagnose_collectives, diagnose_rpc}) {
    try {
      part(parsed, any_silent, out);
    } catch (const std::exception& e) {
      out.push_back(std::string("part of the debug info could not be read: ") + e.what());
    }
  }
  if (out.empty()) out.push_back("no rank is waiting on another");
  return out;
}

}  // namespace gw::debug
