#include "debug/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/trace.h"
#include "debug/progress.h"

namespace gw::debug {

namespace {

// The timeline's clock, so that dumps and traces line up (to the kernel's tick: a dump is read
// for what hangs or failed, and every collective and call is stamped three times).
using trace::coarse_now_us;
using trace::now_us;

// A fixed-size text field: recording never allocates.
template <size_t N>
struct Text {
  uint8_t size = 0;  // first: an empty field's write touches one cache line
  std::array<char, N> chars{};
  void set(std::string_view s) {
    if (auto nl = s.find('\n'); nl != std::string_view::npos) s = s.substr(0, nl);
    size_t n = std::min(s.size(), N);
    // Not inside a UTF-8 character: back off over its continuation bytes.
    if (n < s.size())
      while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    size = static_cast<uint8_t>(n);
    if (size > 0) std::memcpy(chars.data(), s.data(), size);  // an empty view may be null
  }
  std::string str() const { return {chars.data(), size}; }
};

// What record() writes under the ring's lock, and info() reads under it.
struct Fields {
  Kind kind = Kind::kCollective;
  int peer = -1;
  int64_t seq = -1;
  int64_t scheduled_us = 0;
  Text<32> group;
  Text<64> op;
  Text<96> detail;
  Text<160> error;  // written under the lock too, with kFailed
};

// An event. Its id and state share one word, so that update() moves the state with one
// compare-and-swap instead of the ring's lock (two more locked instructions, each as dear as a
// small collective's own work): a slot overwritten meanwhile has another id, and the swap
// fails. Its first lines hold what every record writes (a slot is cold, last written a lap of
// the ring ago).
struct Slot {
  std::atomic<uint64_t> tag{0};  // id << 2 | state; id 0: never used
  std::atomic<int64_t> started_us{0}, finished_us{0};
  Fields f;
};
constexpr uint64_t tag_of(uint64_t id, State state) {
  return id << 2 | static_cast<uint64_t>(state);
}
constexpr uint64_t id_of(uint64_t tag) { return tag >> 2; }
static_assert(static_cast<uint64_t>(State::kFailed) <= 3, "a state takes two bits of a tag");
constexpr State state_of(uint64_t tag) { return static_cast<State>(tag & 3); }
constexpr bool ended(State state) { return state == State::kCompleted || state == State::kFailed; }

constexpr size_t kDefaultSize = 2000;

size_t capacity_from_env() {
  const char* v = std::getenv("GW_FLIGHT_RECORDER_SIZE");
  if (v == nullptr || *v == '\0') return kDefaultSize;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  GW_CHECK(*end == '\0' && n >= 0 && n <= 10'000'000, InvalidArgumentError,
           "[flight recorder] GW_FLIGHT_RECORDER_SIZE must be a number of events in [0, 1e7], "
           "got '",
           v, "'");
  return static_cast<size_t>(n);
}

class Recorder {
 public:
  // Never throws: a recorder that cannot be what its environment asks is one that warns.
  Recorder() {
    try {
      capacity_ = capacity_from_env();
      slots_ = std::make_unique<Slot[]>(capacity_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gw: %s; keeping the default of %zu events\n", e.what(), kDefaultSize);
      capacity_ = kDefaultSize;
      slots_ = std::make_unique<Slot[]>(capacity_);
    }
    if (const char* p = std::getenv("GW_PROGRESS_FILE"); p != nullptr && *p != '\0') {
      try {
        progress_ = ProgressFile::open(p);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gw: %s: gwrun cannot tell this process's progress\n", e.what());
      }
    }
    if (const char* r = std::getenv("RANK"); r != nullptr && *r != '\0') rank_ = std::atoi(r);
  }

  uint64_t record(const EventInfo& e) {
    if (progress_) progress_->started();
    if (capacity_ == 0) return 0;
    const int64_t t = coarse_now_us();
    std::lock_guard lock(mu_);
    const uint64_t id = next_id_++;
    Slot& s = slots_[id % capacity_];
    s.f.kind = e.kind;
    s.f.peer = e.peer;
    s.f.seq = e.seq;
    s.f.scheduled_us = t;
    s.f.group.set(e.group);
    s.f.op.set(e.op);
    s.f.detail.set(e.detail);
    s.f.error.set({});
    s.started_us.store(e.state == State::kStarted ? t : 0, std::memory_order_relaxed);
    s.finished_us.store(0, std::memory_order_relaxed);
    s.tag.store(tag_of(id, e.state), std::memory_order_release);
    // The next record writes a slot cold from the last lap of the ring: fetch it now, while
    // this operation runs (at two MPI ranks a small allreduce took 0.1-0.15 us longer without).
    const char* next = reinterpret_cast<const char*>(&slots_[(id + 1) % capacity_]);
    for (size_t at = 0; at < sizeof(Slot); at += 64) __builtin_prefetch(next + at, 1);
    __builtin_prefetch(next + sizeof(Slot) - 1, 1);  // a slot need not start a cache line
    return id;
  }

  void update(uint64_t id, State state, std::string_view error) {
    if (progress_ && ended(state)) progress_->finished();
    if (id == 0) return;
    const int64_t t = coarse_now_us();
    Slot& s = slots_[id % capacity_];
    // The error is text, written under the lock; a failure is rare.
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (state == State::kFailed) lock.lock();
    uint64_t tag = s.tag.load(std::memory_order_acquire);
    do {
      // Overwritten; or ended already, which it stays (a collective failed by an abort before
      // it was marked started).
      if (id_of(tag) != id || ended(state_of(tag))) return;
    } while (!s.tag.compare_exchange_weak(tag, tag_of(id, state), std::memory_order_acq_rel));
    // Stamped after the swap: a record overwriting the slot in between (a whole lap of the
    // ring later) would see this time as its own. Only the dump's times could be off.
    (ended(state) ? s.finished_us : s.started_us).store(t, std::memory_order_relaxed);
    if (state == State::kFailed) s.f.error.set(error);
  }

  void set_identity(int rank, std::string_view name) {
    std::lock_guard lock(mu_);
    rank_ = rank;
    if (!name.empty()) name_ = std::string(name);
  }
  int rank() {
    std::lock_guard lock(mu_);
    return rank_;
  }

  uint64_t add_section(std::string name, std::function<std::string()> json) {
    std::lock_guard lock(sections_mu_);
    const uint64_t id = next_section_++;
    sections_.emplace(id, std::make_pair(std::move(name), std::move(json)));
    return id;
  }
  void remove_section(uint64_t id) {
    std::lock_guard lock(sections_mu_);
    sections_.erase(id);
  }

  std::string info(std::string_view reason) {
    nlohmann::json j;
    struct Copy {
      uint64_t tag;
      int64_t started_us, finished_us;
      Fields f;
    };
    std::vector<Copy> copy;
    {
      std::lock_guard lock(mu_);
      j["rank"] = rank_;
      j["name"] = name_;
      const uint64_t n = std::min<uint64_t>(next_id_ - 1, capacity_);
      for (uint64_t id = next_id_ - n; id < next_id_; ++id) {
        const Slot& s = slots_[id % capacity_];
        copy.push_back({s.tag.load(std::memory_order_acquire),
                        s.started_us.load(std::memory_order_relaxed),
                        s.finished_us.load(std::memory_order_relaxed), s.f});
      }
    }
    j["pid"] = static_cast<int64_t>(::getpid());
    j["reason"] = std::string(reason);
    const int64_t now = now_us();
    j["dumped_at_us"] = now;
    j["capacity"] = capacity_;
    auto& events = j["events"] = nlohmann::json::array();
    for (const Copy& c : copy) {
      const State state = state_of(c.tag);
      const Fields& f = c.f;
      nlohmann::json e = {{"id", id_of(c.tag)},
                          {"kind", to_string(f.kind)},
                          {"state", to_string(state)},
                          {"group", f.group.str()},
                          {"seq", f.seq},
                          {"op", f.op.str()},
                          {"detail", f.detail.str()},
                          {"peer", f.peer},
                          {"scheduled_us", f.scheduled_us},
                          {"started_us", c.started_us},
                          {"finished_us", c.finished_us}};
      // An end not yet stamped (update() swaps the state first) counts as now.
      const int64_t end = ended(state) && c.finished_us != 0 ? c.finished_us : now;
      e["age_ms"] = (end - f.scheduled_us) / 1000.0;
      if (state == State::kFailed) e["error"] = f.error.str();
      events.push_back(std::move(e));
    }
    auto& sections = j["sections"] = nlohmann::json::object();
    std::lock_guard lock(sections_mu_);  // a section's owner removes it under this lock
    for (const auto& [id, named] : sections_) {
      try {
        sections[named.first].push_back(nlohmann::json::parse(named.second()));
      } catch (const std::exception& e) {
        sections[named.first].push_back({{"error", e.what()}});
      }
    }
    // Names and errors come from users: text that is not UTF-8 is replaced, not thrown on.
    return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

 private:
  std::mutex mu_;
  size_t capacity_ = 0;
  std::unique_ptr<Slot[]> slots_;
  uint64_t next_id_ = 1;
  int rank_ = -1;
  std::string name_;
  std::unique_ptr<ProgressFile> progress_;
  std::mutex sections_mu_;
  std::map<uint64_t, std::pair<std::string, std::function<std::string()>>> sections_;
  uint64_t next_section_ = 1;
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: used by threads up to exit
  return *r;
}

class Dumper;
Dumper& dumper();

// The thread that writes dumps: SIGUSR1's handler and request_dump() wake it through a pipe.
class Dumper {
 public:
  Dumper() {
    GW_CHECK(::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) == 0, IoError,
             "[flight recorder] cannot make the dump pipe: ", std::strerror(errno));
    std::thread([this] { loop(); }).detach();  // lives as long as the process
    std::atexit([] { dumper().at_exit(); });
  }
  // A child forked without exec runs the exit handlers too: it leaves the parent's file alone.
  const pid_t owner = ::getpid();
  // A process that fails right after its operation did (the usual case) exits before the
  // thread could write: what was asked for is written on the way out. Under gwrun's watch
  // (GW_PROGRESS_FILE) every worker leaves its last state, so that the hang doctor sees the
  // ranks that are gone too.
  void at_exit() {
    if (::getpid() != owner) return;
    std::vector<std::string> reasons;
    {
      std::lock_guard lock(mu_);
      reasons.swap(reasons_);
    }
    const char* watched = std::getenv("GW_PROGRESS_FILE");
    if (reasons.empty() && watched != nullptr && *watched != '\0')
      write({"exit"}, /*quiet=*/true);
    else
      write(reasons);
  }
  // Async-signal-safe (errno is the interrupted code's).
  void wake(char why) const {
    const int saved = errno;
    [[maybe_unused]] auto n = ::write(pipe_[1], &why, 1);
    errno = saved;
  }
  // At most one dump a second on request: a group that fails every collective, or a loop
  // polling Work::wait(timeout), writes one, not one per failure. SIGUSR1 is always answered.
  void ask(std::string_view reason) {
    {
      std::lock_guard lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      if (last_ != std::chrono::steady_clock::time_point{} && now - last_ < std::chrono::seconds(1))
        return;
      last_ = now;
      reasons_.emplace_back(reason);
    }
    wake('r');
  }

 private:
  void loop() {
    while (true) {
      pollfd p{pipe_[0], POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return;
      char buf[64];
      bool signalled = false;
      ssize_t n;
      while ((n = ::read(pipe_[0], buf, sizeof buf)) > 0)
        signalled = signalled || std::memchr(buf, 's', static_cast<size_t>(n)) != nullptr;
      std::vector<std::string> reasons;
      {
        std::lock_guard lock(mu_);
        reasons.swap(reasons_);
      }
      if (signalled) reasons.push_back("SIGUSR1");
      write(reasons);
    }
  }

  void write(const std::vector<std::string>& reasons, bool quiet = false) {
    if (reasons.empty()) return;
    std::string joined;
    for (const auto& r : reasons) joined += (joined.empty() ? "" : "; ") + r;
    try {
      const std::string path = dump_now(joined);
      if (!quiet)
        std::fprintf(stderr, "gw: debug info (%s) written to %s\n", joined.c_str(), path.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gw: could not write debug info: %s\n", e.what());
    }
  }

  int pipe_[2] = {-1, -1};
  std::mutex mu_;
  std::vector<std::string> reasons_;
  std::chrono::steady_clock::time_point last_{};  // of the last dump asked for
};

Dumper& dumper() {
  static Dumper* d = new Dumper();  // its thread outlives every static
  return *d;
}

void on_sigusr1(int) { dumper().wake('s'); }

}  // namespace

const char* to_string(Kind kind) {
  switch (kind) {
    case Kind::kCollective:
      return "collective";
    case Kind::kRpcCall:
      return "rpc_call";
    case Kind::kRpcServe:
      return "rpc_serve";
    case Kind::kDistAutograd:
      return "dist_autograd";
  }
  return "?";
}

const char* to_string(State state) {
  switch (state) {
    case State::kScheduled:
      return "scheduled";
    case State::kStarted:
      return "started";
    case State::kCompleted:
      return "completed";
    case State::kFailed:
      return "failed";
  }
  return "?";
}

uint64_t record(const EventInfo& event) { return recorder().record(event); }
void update(uint64_t id, State state, std::string_view error) {
  recorder().update(id, state, error);
}
void finish(uint64_t id, const std::exception_ptr& failure) {
  if (failure)
    recorder().update(id, State::kFailed, what_of(failure));
  else
    recorder().update(id, State::kCompleted, {});
}
void set_identity(int rank, std::string_view name) { recorder().set_identity(rank, name); }

Section::Section(std::string name, std::function<std::string()> json)
    : id_(recorder().add_section(std::move(name), std::move(json))) {}
Section::~Section() {
  if (id_ != 0) recorder().remove_section(id_);
}
Section::Section(Section&& other) noexcept : id_(std::exchange(other.id_, 0)) {}
Section& Section::operator=(Section&& other) noexcept {
  if (this != &other) {
    if (id_ != 0) recorder().remove_section(id_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

std::string get_debug_info(std::string_view reason) { return recorder().info(reason); }

std::string dump_path() {
  if (const char* file = std::getenv("GW_DEBUG_DUMP_FILE"); file != nullptr && *file != '\0')
    return file;  // gwrun's name for this worker's
  const char* dir = std::getenv("GW_DEBUG_DUMP_DIR");
  const std::filesystem::path base = dir != nullptr && *dir != '\0'
                                         ? std::filesystem::path(dir)
                                         : std::filesystem::temp_directory_path();
  const int rank = recorder().rank();
  const std::string who =
      rank >= 0 ? "rank" + std::to_string(rank) : "pid" + std::to_string(::getpid());
  return (base / ("gw_debug." + who + ".json")).string();
}

std::string dump_now(std::string_view reason) {
  // The dump thread, a caller, the exit: one file name. Never destroyed: used at exit.
  static std::mutex* one_at_a_time = new std::mutex;
  std::lock_guard lock(*one_at_a_time);
  const std::string path = dump_path();
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << get_debug_info(reason) << "\n";
    GW_CHECK(out.good(), IoError, "[flight recorder] cannot write ", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  GW_CHECK(!ec, IoError, "[flight recorder] cannot rename ", tmp, " to ", path, ": ", ec.message());
  return path;
}

void request_dump(std::string_view reason) { dumper().ask(reason); }

void dump_on_sigusr1() {
  static std::once_flag once;
  std::call_once(once, [] {
    dumper();  // its thread first: the handler only writes to its pipe
    struct sigaction old {};
    if (::sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO) != 0)
      return;  // the program's own
    struct sigaction sa {};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
  });
}

}  // namespace gw::debug
