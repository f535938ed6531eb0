#include "core/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <time.h>

#include "core/error.h"

namespace gw::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

struct Event {
  char ph;  // 'X' span, 's'/'f' flow
  int tid;
  int64_t ts, dur;
  uint64_t id;
  const char* cat;
  std::string name, args;
};

size_t max_events() {
  const char* v = std::getenv("GW_TRACE_MAX_EVENTS");
  if (v == nullptr || *v == '\0') return 1'000'000;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  GW_CHECK(*end == '\0' && n > 0, InvalidArgumentError,
           "[trace] GW_TRACE_MAX_EVENTS must be a positive number, got '", v, "'");
  return static_cast<size_t>(n);
}

int rank_from_env() {
  const char* r = std::getenv("RANK");
  return r != nullptr && *r != '\0' ? std::atoi(r) : 0;
}

void escape_into(std::string& out, const std::string& s) {
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

class Tracer {
 public:
  Tracer() {
    if (const char* p = std::getenv("GW_TRACE"); p != nullptr && *p != '\0') begin(p);
  }

  void begin(const std::string& path) {
    const size_t limit = max_events();
    std::lock_guard lock(mu_);
    GW_CHECK(path_.empty(), StateError, "[trace] a trace into ", path_,
             " is being collected already (GW_TRACE and --trace both?)");
    path_ = path;
    limit_ = limit;
    dropped_ = 0;
    events_.reserve(std::min<size_t>(limit_, 1 << 16));
    if (!at_exit_) {
      at_exit_ = true;
      std::atexit([] {
        try {
          tracer().end();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "gw: %s\n", e.what());
        }
      });
    }
    detail::g_enabled.store(true, std::memory_order_relaxed);
  }

  std::string end(bool write = true) {
    detail::g_enabled.store(false, std::memory_order_relaxed);
    // Taken out under the lock, written outside it: a span ending meanwhile does not wait.
    std::vector<Event> events;
    std::string path;
    {
      std::lock_guard lock(mu_);
      events.swap(events_);
      path.swap(path_);
    }
    if (path.empty() || !write) return "";
    std::lock_guard lock(mu_);  // rank_, name_, tracks_, dropped_ (spans add nothing now)
    const std::string file = path + ".rank" + std::to_string(rank_) + ".json";
    const std::string aside = file + ".tmp";  // renamed when whole: a reader sees all or none
    std::ofstream out(aside, std::ios::trunc);
    out << "{\"traceEvents\":[\n";
    std::string line;
    auto emit = [&](bool last) { out << line << (last ? "\n" : ",\n"); };
    line = meta("process_name", 0,
                "rank " + std::to_string(rank_) + (name_.empty() ? "" : " (" + name_ + ")"));
    emit(false);
    line = "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(rank_) +
           ",\"args\":{\"sort_index\":" + std::to_string(rank_) + "}}";
    emit(false);
    for (const auto& [name, tid] : tracks_) {
      line = meta("thread_name", tid, name);
      emit(false);
    }
    line = format_dropped();
    emit(events.empty());
    for (size_t i = 0; i < events.size(); ++i) {
      line = format(events[i]);
      emit(i + 1 == events.size());
    }
    out << "],\"displayTimeUnit\":\"ms\"}\n";
    out.close();
    GW_CHECK(!out.fail() && std::rename(aside.c_str(), file.c_str()) == 0, IoError,
             "[trace] cannot write ", file);
    return file;
  }

  void add(Event e) {
    std::lock_guard lock(mu_);
    if (path_.empty()) return;
    if (events_.size() >= limit_) {
      ++dropped_;
      return;
    }
    events_.push_back(std::move(e));
  }

  int track(const std::string& name) {
    std::lock_guard lock(mu_);
    auto [it, added] = tracks_.emplace(name, kFirstTrack + static_cast<int>(tracks_.size()));
    return it->second;
  }

  void set_process(int rank, const std::string& name) {
    std::lock_guard lock(mu_);
    rank_ = rank;
    if (!name.empty()) name_ = name;
  }
  int rank() {
    std::lock_guard lock(mu_);
    return rank_;
  }

  static Tracer& tracer() {
    static Tracer* t = new Tracer();  // never destroyed: spans end up to exit
    return *t;
  }

 private:
  static constexpr int kFirstTrack = 1'000'000;  // above any thread's number

  std::string meta(const char* what, int tid, const std::string& name) const {
    std::string s = "{\"ph\":\"M\",\"name\":\"";
    s += what;
    s += "\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(tid) +
         ",\"args\":{\"name\":\"";
    escape_into(s, name);
    return s + "\"}}";
  }
  std::string format_dropped() const {
    return "{\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":" + std::to_string(rank_) +
           ",\"args\":{\"labels\":\"" + std::to_string(dropped_) + " events dropped\"}}";
  }
  std::string format(const Event& e) const {
    std::string s = "{\"ph\":\"";
    s += e.ph;
    s += "\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(e.tid) +
         ",\"ts\":" + std::to_string(e.ts);
    if (e.ph == 'X') {
      s += ",\"dur\":" + std::to_string(e.dur) + ",\"cat\":\"" + e.cat + "\",\"name\":\"";
      escape_into(s, e.name);
      s += "\"";
      if (!e.args.empty()) s += ",\"args\":" + e.args;
    } else {
      s += ",\"cat\":\"flow\",\"name\":\"flow\",\"id\":" + std::to_string(e.id);
      if (e.ph == 'f') s += ",\"bp\":\"e\"";
    }
    return s + "}";
  }

  std::mutex mu_;
  std::string path_;
  size_t limit_ = 0;
  size_t dropped_ = 0;
  bool at_exit_ = false;
  int rank_ = rank_from_env();
  std::string name_;
  std::vector<Event> events_;
  std::map<std::string, int> tracks_;
};

// Made at program start, so that GW_TRACE takes effect before the first span.
[[maybe_unused]] const bool kFromEnvironment = (Tracer::tracer(), true);

}  // namespace

void start(const std::string& path) { Tracer::tracer().begin(path); }
std::string stop() { return Tracer::tracer().end(); }
void cancel() { Tracer::tracer().end(/*write=*/false); }
void set_process(int rank, const std::string& name) { Tracer::tracer().set_process(rank, name); }
int rank() { return Tracer::tracer().rank(); }

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t coarse_now_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME_COARSE, &ts);  // the vDSO's copy of the last tick: no clock read
  return int64_t{ts.tv_sec} * 1'000'000 + ts.tv_nsec / 1000;
}

int track(const std::string& name) { return Tracer::tracer().track(name); }

int current_thread() {
  static std::atomic<int> next{1};
  thread_local const int tid = next.fetch_add(1);
  return tid;
}

void complete(const char* cat, std::string name, int64_t start_us, int64_t end_us, int tid,
              std::string args) {
  if (!enabled()) return;
  Tracer::tracer().add(
      {'X', tid, start_us, end_us - start_us, 0, cat, std::move(name), std::move(args)});
}

void flow(bool start, uint64_t id, int64_t ts_us, int tid) {
  if (!enabled()) return;
  Tracer::tracer().add({start ? 's' : 'f', tid, ts_us, 0, id, "flow", {}, {}});
}

Scope::Scope(const char* cat, std::string name, std::string args) : cat_(cat) {
  if (!enabled()) return;
  name_ = std::move(name);
  args_ = std::move(args);
  start_ = now_us();
}

Scope::~Scope() {
  if (start_ < 0) return;
  try {
    complete(cat_, std::move(name_), start_, std::max(now_us(), start_ + 2), current_thread(),
             std::move(args_));
  } catch (...) {  // out of memory: the span is lost, not the program
  }
}

uint64_t rpc_flow(int caller, uint64_t message_id, bool response) {
  // bit 63: response; bits 40..62: caller + 1; bits 0..39: the message id. Bit 62 clear.
  const uint64_t request = (static_cast<uint64_t>(caller + 1) << 40 & ~(uint64_t{3} << 62)) |
                           (message_id & ((uint64_t{1} << 40) - 1));
  return response ? request | (uint64_t{1} << 63) : request;
}

uint64_t collective_flow(const std::string& group, int64_t seq, int peer) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the group's name, seq and peer
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  for (char c : group) mix(static_cast<unsigned char>(c));
  mix(static_cast<uint64_t>(seq));
  mix(static_cast<uint64_t>(peer));
  return (h >> 2) | (uint64_t{1} << 62);  // bit 62 set, bit 63 clear: no RPC flow's
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  escape_into(out, s);
  return out + "\"";
}

void merge(const std::vector<std::string>& inputs, const std::string& output) {
  std::vector<std::string> events;
  for (const auto& path : inputs) {
    std::ifstream in(path);
    GW_CHECK(in.good(), IoError, "[trace] cannot read ", path);
    std::string line;
    GW_CHECK(std::getline(in, line) && line == "{\"traceEvents\":[", IoError, "[trace] ", path,
             " is not a trace file written by gw::trace");
    while (std::getline(in, line) && !line.starts_with("]")) {
      if (line.ends_with(",")) line.pop_back();
      events.push_back(std::move(line));
    }
  }
  std::ofstream out(output, std::ios::trunc);
  out << "{\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i)
    out << events[i] << (i + 1 == events.size() ? "\n" : ",\n");
  out << "],\"displayTimeUnit\":\"ms\"}\n";
  out.close();
  GW_CHECK(!out.fail(), IoError, "[trace] cannot write ", output);
}

}  // namespace gw::trace
