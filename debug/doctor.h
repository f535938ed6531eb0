// gw::debug::diagnose — the hang doctor: reads every rank's flight recorder dump
// (flight_recorder.h) and says, in a few lines, which rank is where and why the job waits.
//
// It looks for the three things nearly every hang is:
//   - a collective desync: ranks of a group in different collectives, or the same one with
//     different shapes ("rank 1 is in allreduce #57 [4096] float32 while ranks 0, 2 are in
//     broadcast #57 [4096] float32"), or a rank that never called the collective the others
//     are in;
//   - a cycle of blocking RPCs ("worker0 → worker1 → worker2 → worker0: every worker's pool is
//     busy waiting");
//   - silent ranks: no dump came back (stopped, blocked with signals masked, or gone).
//
//   std::map<int, gw::debug::RankDump> dumps;     // the ranks looked at, by rank
//   dumps[0] = {gw::debug::get_debug_info(), ""};
//   dumps[1] = {std::nullopt, "sent no debug info within 5 s"};
//   for (const auto& line : gw::debug::diagnose(dumps)) std::cerr << line << "\n";
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gw::debug {

struct RankDump {
  std::optional<std::string> json;  // its get_debug_info(), or none
  std::string missing;              // why there is none, for the finding
};

// Looks at the ranks in `dumps` (a job's ranks on other hosts may be absent). A dump that does
// not parse counts as missing, and the line says why. Returns the diagnosis, one finding per
// line; "no rank is waiting on another" when there is nothing to say.
std::vector<std::string> diagnose(const std::map<int, RankDump>& dumps);

// Why a dump was written: "exit" (a worker under gwrun, on its way out), "SIGUSR1", or the
// operation that timed out or failed; empty if `json` does not parse.
std::string dump_reason(const std::string& json);

}  // namespace gw::debug
