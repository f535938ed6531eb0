#include "bench/harness.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>

#include "core/cpu/sgemm.h"

namespace gw::bench {

bool lower_is_better(const std::string& unit) {
  return unit == "ns" || unit == "us" || unit == "ms" || unit == "s" || unit == "B" ||
         unit == "KiB" || unit == "MiB" || unit == "GiB" || unit == "nats" ||  // nats: a loss
         unit == "% idle";  // a pipeline's bubble
}

bool anchor_measured(const Row& row) { return row.note != kPublishedFigure && row.note != kGoal; }

double speedup(const Row& row) {
  if (row.value <= 0 || row.anchor_value <= 0) return 0;
  return lower_is_better(row.unit) ? row.anchor_value / row.value : row.value / row.anchor_value;
}

Reporter::Reporter(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--json") {
      json_ = true;
    } else {
      filter_ = arg;
    }
  }
}

Reporter::~Reporter() { std::cout.flush(); }

bool Reporter::wants(const std::string& bench, const std::string& name) const {
  return filter_.empty() || (bench + "/" + name).find(filter_) != std::string::npos;
}

namespace {
std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(v >= 100 ? 5 : 4) << v;
  return os.str();
}
}  // namespace

void Reporter::add(const Row& row) {
  double s = speedup(row);
  if (json_) {
    std::cout << "{\"bench\":\"" << json_escape(row.bench) << "\",\"case\":\""
              << json_escape(row.name) << "\",\"value\":" << fmt(row.value) << ",\"unit\":\""
              << json_escape(row.unit) << "\",\"anchor\":\"" << json_escape(row.anchor)
              << "\",\"anchor_value\":" << fmt(row.anchor_value)
              << ",\"speedup\":" << (anchor_measured(row) ? fmt(s) : "null")
              << ",\"anchor_measured\":" << (anchor_measured(row) ? "true" : "false");
    if (!row.note.empty()) std::cout << ",\"note\":\"" << json_escape(row.note) << "\"";
    std::cout << "}" << std::endl;
    return;
  }
  if (!header_printed_) {
    std::cout << std::left << std::setw(15) << "bench" << std::setw(30) << "case" << std::right
              << std::setw(12) << "gradwire" << "  " << std::left << std::setw(10) << "unit"
              << std::setw(16) << "anchor" << std::right << std::setw(12) << "anchor"
              << std::setw(10) << "speedup" << "\n";
    header_printed_ = true;
  }
  std::cout << std::left << std::setw(15) << row.bench << std::setw(30) << row.name << std::right
            << std::setw(12) << fmt(row.value) << "  " << std::left << std::setw(10) << row.unit
            << std::setw(16) << row.anchor << std::right << std::setw(12) << fmt(row.anchor_value);
  if (row.note == kPublishedFigure)
    std::cout << "  anchor not run (a published figure)";
  else if (row.note == kGoal)
    std::cout << (s >= 1 ? "  goal met" : "  goal missed");
  else
    std::cout << std::setw(9) << fmt(s) << "x" << (row.note.empty() ? "" : "  (" + row.note + ")");
  std::cout << std::endl;
}

void Reporter::skip(const std::string& bench, const std::string& name, const std::string& why) {
  if (!wants(bench, name)) return;
  if (json_)
    std::cout << "{\"bench\":\"" << json_escape(bench) << "\",\"case\":\"" << json_escape(name)
              << "\",\"skipped\":\"" << json_escape(why) << "\"}" << std::endl;
  else
    std::cout << std::left << std::setw(15) << bench << std::setw(30) << name << "  skipped: "
              << why << std::endl;
}

double seconds_per_call(const std::function<void()>& f, double min_seconds, int trials) {
  using Clock = std::chrono::steady_clock;
  f();  // warm up caches, allocator, page tables
  int64_t batch = 1;
  double best = INFINITY;
  for (int t = 0; t < trials;) {
    auto start = Clock::now();
    for (int64_t i = 0; i < batch; ++i) f();
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed < min_seconds) {
      batch = std::max<int64_t>(batch * 2, static_cast<int64_t>(batch * min_seconds / (elapsed + 1e-9) * 0.5));
      continue;
    }
    best = std::min(best, elapsed / static_cast<double>(batch));
    ++t;
  }
  return best;
}

double fastest_window(const std::vector<double>& seconds, size_t skip, size_t window) {
  double best = 1e300;
  for (size_t s = skip; s + window <= seconds.size(); ++s)
    best =
        std::min(best, std::accumulate(seconds.begin() + static_cast<ptrdiff_t>(s),
                                       seconds.begin() + static_cast<ptrdiff_t>(s + window), 0.0));
  return best;
}

std::pair<double, double> seconds_per_call_pair(const std::function<void()>& f,
                                                const std::function<void()>& g,
                                                double min_seconds, int trials) {
  double best_f = INFINITY, best_g = INFINITY;
  for (int t = 0; t < trials; ++t) {
    best_f = std::min(best_f, seconds_per_call(f, min_seconds, 1));
    best_g = std::min(best_g, seconds_per_call(g, min_seconds, 1));
  }
  return {best_f, best_g};
}

std::string size_label(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (size_t{1} << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::optional<std::string> run_capture(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  if (pclose(pipe) != 0) return std::nullopt;
  return out;
}

std::string executable_dir() {
  std::array<char, 4096> buf{};
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  std::string path(buf.data(), static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

namespace {
// Where the value after "key": starts in a flat JSON line (spaces skipped), or npos.
size_t value_start(const std::string& text, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const size_t pos = text.find(needle);
  return pos == std::string::npos ? pos : text.find_first_not_of(" \t", pos + needle.size());
}
}  // namespace

std::optional<double> json_number(const std::string& text, const std::string& key) {
  const size_t pos = value_start(text, key);
  if (pos == std::string::npos) return std::nullopt;
  try {
    return std::stod(text.substr(pos));
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<std::string> json_string(const std::string& text, const std::string& key) {
  const size_t pos = value_start(text, key);
  if (pos == std::string::npos || text[pos] != '"') return std::nullopt;  // not a string
  const size_t end = text.find('"', pos + 1);
  if (end == std::string::npos) return std::nullopt;
  return text.substr(pos + 1, end - pos - 1);
}

std::string blas_note(const std::string& anchor_output, int threads) {
  const std::string ours = gw::cpu::kHaveSgemm
                               ? "; gradwire on its AVX-512 GEMM (float32; Eigen otherwise), "
                               : "; gradwire on Eigen, ";
  return "torch on " + json_string(anchor_output, "blas").value_or("an unreported BLAS") + ours +
         std::to_string(threads) + (threads == 1 ? " thread" : " threads");
}

}  // namespace gw::bench
