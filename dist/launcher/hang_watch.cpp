#include "dist/launcher/hang_watch.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "dist/debug/doctor.h"

namespace gw::launcher {

namespace {
constexpr auto kCheckPeriod = std::chrono::milliseconds(250);
constexpr auto kDumpWait = std::chrono::seconds(5);
constexpr auto kDumpPoll = std::chrono::milliseconds(50);

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

HangWatch::HangWatch(double stall_s) : stall_s_(stall_s) {
  if (const char* dir = std::getenv("GW_DEBUG_DUMP_DIR"); dir != nullptr && *dir != '\0') {
    dir_ = dir;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    GW_CHECK(!ec, IoError, "[gwrun] cannot make GW_DEBUG_DUMP_DIR ", dir_, ": ", ec.message());
    return;
  }
  std::string pattern = (std::filesystem::temp_directory_path() / "gwrun-debug-XXXXXX").string();
  GW_CHECK(::mkdtemp(pattern.data()) != nullptr, IoError, "[gwrun] cannot make a directory ",
           pattern, ": ", std::strerror(errno));
  dir_ = pattern;
  own_dir_ = true;
}

HangWatch::~HangWatch() {
  progress_.clear();
  if (!own_dir_) return;
  std::error_code ec;
  if (keep_dir_) {  // only the dumps stay
    for (int i = 0; i < static_cast<int>(last_.size()); ++i)
      std::filesystem::remove(dir_ + "/progress." + std::to_string(i), ec);
  } else {
    std::filesystem::remove_all(dir_, ec);
  }
}

void HangWatch::start_round(int nproc) {
  progress_.clear();
  for (int i = 0; i < nproc; ++i)
    progress_.push_back(debug::ProgressFile::create(dir_ + "/progress." + std::to_string(i)));
  last_.assign(static_cast<size_t>(nproc), {});
  round_start_us_ = now_us();
  last_change_ = Clock::now();
  reported_ = false;
  next_check_ = stall_s_ > 0 ? Clock::now() + kCheckPeriod : Clock::time_point::max();
}

std::vector<std::pair<std::string, std::string>> HangWatch::environment(int local_rank) const {
  return {{"GW_DEBUG_DUMP_DIR", dir_},
          {"GW_PROGRESS_FILE", dir_ + "/progress." + std::to_string(local_rank)}};
}

bool HangWatch::stalled() {
  if (stall_s_ <= 0 || reported_ || Clock::now() < next_check_) return false;
  next_check_ = Clock::now() + kCheckPeriod;
  bool waiting = false;
  for (size_t i = 0; i < progress_.size(); ++i) {
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
  return dir_ + "/gw_debug.rank" + std::to_string(rank) + ".json";
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
  keep_dir_ = true;
  lines.push_back("every rank's debug info is in " + dir_);
  return lines;
}

}  // namespace gw::launcher
