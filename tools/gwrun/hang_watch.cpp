#include "tools/gwrun/hang_watch.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/trace.h"
#include "debug/doctor.h"

namespace gw::gwrun {

namespace {
constexpr auto kCheckPeriod = std::chrono::milliseconds(250);
constexpr auto kDumpWait = std::chrono::seconds(5);
constexpr auto kDumpPoll = std::chrono::milliseconds(50);

using trace::now_us;  // the clock dumps are stamped with
}  // namespace

HangWatch::HangWatch(double stall_s) : stall_s_(stall_s) {
  // Progress files in a directory of this gwrun's own: another job's, or a nested gwrun's,
  // never shares them.
  std::string pattern = (std::filesystem::temp_directory_path() / "gwrun-debug-XXXXXX").string();
  GW_CHECK(::mkdtemp(pattern.data()) != nullptr, IoError, "[gwrun] cannot make a directory ",
           pattern, ": ", std::strerror(errno));
  own_dir_ = pattern;
  dump_dir_ = own_dir_;
  if (const char* dir = std::getenv("GW_DEBUG_DUMP_DIR"); dir != nullptr && *dir != '\0') {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (!ec) dump_dir_ = dir;
  }
}

HangWatch::~HangWatch() {
  progress_.clear();
  std::error_code ec;
  if (!keep_dumps_ || dump_dir_ != own_dir_) {
    std::filesystem::remove_all(own_dir_, ec);
    return;
  }
  for (int i = 0; i < static_cast<int>(last_.size()); ++i)  // the dumps stay
    std::filesystem::remove(progress_file(i), ec);
}

std::string HangWatch::progress_file(int local_rank) const {
  return own_dir_ + "/progress." + std::to_string(local_rank);
}

void HangWatch::start_round(int nproc) {
  progress_.clear();
  for (int i = 0; i < nproc; ++i)
    progress_.push_back(debug::ProgressFile::create(progress_file(i)));
  last_.assign(static_cast<size_t>(nproc), {});
  round_start_us_ = now_us();
  last_change_ = Clock::now();
  reported_ = false;
  next_check_ = stall_s_ > 0 ? Clock::now() + kCheckPeriod : Clock::time_point::max();
}

std::vector<std::pair<std::string, std::string>> HangWatch::environment(int local_rank,
                                                                        int rank) const {
  return {{"GW_DEBUG_DUMP_DIR", dump_dir_},
          {"GW_DEBUG_DUMP_FILE", dump_file(rank)},
          {"GW_PROGRESS_FILE", progress_file(local_rank)}};
}

bool HangWatch::stalled(const std::vector<bool>& alive) {
  if (stall_s_ <= 0 || reported_ || Clock::now() < next_check_) return false;
  next_check_ = Clock::now() + kCheckPeriod;
  bool waiting = false;
  for (size_t i = 0; i < progress_.size(); ++i) {
    if (i >= alive.size() || !alive[i]) continue;  // what a worker that is gone left pending
    const debug::ProgressCounts now = progress_[i]->read();
    if (now != last_[i]) {
      last_[i] = now;
      last_change_ = Clock::now();
    }
    waiting = waiting || now.pending();
  }
  if (!waiting) {
    last_change_ = Clock::now();  // computing, or done: not stalled
    return false;
  }
  reported_ = Clock::now() - last_change_ >= std::chrono::duration<double>(stall_s_);
  return reported_;
}

std::string HangWatch::dump_file(int rank) const {
  return dump_dir_ + "/gw_debug.rank" + std::to_string(rank) + ".json";
}

std::optional<std::string> HangWatch::read_dump(int rank, int64_t since_us) const {
  struct stat st {};
  if (::stat(dump_file(rank).c_str(), &st) != 0) return std::nullopt;
  const int64_t written = int64_t{st.st_mtim.tv_sec} * 1'000'000 + st.st_mtim.tv_nsec / 1000;
  if (written < since_us) return std::nullopt;
  std::ifstream in(dump_file(rank));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool HangWatch::dumped_on_failure(int rank) const {
  const auto dump = read_dump(rank, round_start_us_);
  return dump && debug::dump_reason(*dump) != "exit";
}

std::vector<std::string> HangWatch::diagnose(const std::vector<Target>& targets) {
  // A coarse clock may stamp a file a little before the moment we asked.
  const int64_t asked_us = now_us() - 20'000;
  for (const Target& t : targets)
    if (t.alive) ::kill(-t.pid, SIGUSR1);
  std::map<int, debug::RankDump> dumps;
  const auto deadline = Clock::now() + kDumpWait;
  for (;;) {  // bounded by kDumpWait
    bool all = true;
    for (const Target& t : targets) {
      // A live worker must answer now; one that is gone may have dumped when it failed.
      if (auto d = read_dump(t.rank, t.alive ? asked_us : round_start_us_))
        dumps[t.rank] = {std::move(d), ""};
      else
        all = false;
    }
    if (all || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kDumpPoll);
  }
  for (const Target& t : targets) {
    if (dumps.contains(t.rank)) continue;
    if (auto earlier = read_dump(t.rank, round_start_us_)) {  // better than nothing
      dumps[t.rank] = {std::move(earlier), ""};
      continue;
    }
    dumps[t.rank] = {std::nullopt, t.alive ? "sent no debug info within 5 s: it is stopped, "
                                             "blocked with signals masked, or ignores SIGUSR1"
                                           : t.exit + " without debug info"};
  }
  std::vector<std::string> lines = debug::diagnose(dumps);
  if (std::any_of(dumps.begin(), dumps.end(), [](const auto& d) { return d.second.json; })) {
    keep_dumps_ = true;
    lines.push_back("the ranks' debug info is in " + dump_dir_);
  }
  return lines;
}

}  // namespace gw::gwrun
