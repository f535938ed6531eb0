// The benchmark harness shared by every bench_* executable.
//
// Each case is measured beside an anchor — the same work done by a reference (raw Eigen,
// memcpy, raw TCP, Gloo, PyTorch) in the same process run — and reported as one row:
//
//   gw::bench::Reporter report(argc, argv);           // --json, optional name filter
//   double t = gw::bench::seconds_per_call([&] { gw::mm(a, b); });
//   double r = gw::bench::seconds_per_call([&] { raw_eigen(); });
//   report.add({"gemm", "f32 512", 2 * n * n * n / t / 1e9, "GFLOP/s",
//               "eigen", 2 * n * n * n / r / 1e9});
//
// The table prints one aligned line per row; --json prints one JSON object per row with
// bench, case, value, unit, anchor, anchor_value and speedup (> 1: gradwire is faster). A row
// whose anchor did not run (note kPublishedFigure) says so in the speedup column instead of
// showing a ratio; one against a goal (kGoal) says whether it is met.
// Units decide the direction: times (ns, us, ms, s), sizes (B, KiB, MiB, GiB), losses (nats)
// and idle time ("% idle") are lower-is-better, rates higher.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gw::bench {

// Notes that say a row's anchor value was not measured in this run: its speedup column says
// so instead of showing a ratio (JSON: "speedup": null, "anchor_measured": false).
inline constexpr const char* kPublishedFigure = "published figure";  // the anchor did not run
inline constexpr const char* kGoal = "a goal, not a measurement";    // the anchor is a target

struct Row {
  std::string bench;
  std::string name;  // the case
  double value = 0;
  std::string unit;
  std::string anchor;
  double anchor_value = 0;
  std::string note = {};  // e.g. "published figure" when the anchor was not measured here
};

bool lower_is_better(const std::string& unit);
double speedup(const Row& row);
// Whether the anchor value was measured in this run (not a published figure or a goal).
bool anchor_measured(const Row& row);

class Reporter {
 public:
  Reporter(int argc, char** argv);
  ~Reporter();
  // Whether a case whose name is "bench/case" passes the command-line filter.
  bool wants(const std::string& bench, const std::string& name) const;
  void add(const Row& row);
  // A case that cannot run here (e.g. "no device: ..."): one line, or {"skipped": why} in JSON.
  void skip(const std::string& bench, const std::string& name, const std::string& why);
  bool json() const { return json_; }

 private:
  bool json_ = false;
  std::string filter_;
  bool header_printed_ = false;
};

// Mean seconds per call of f: warms up, then times batches of growing size until one batch
// lasts at least `min_seconds`, and returns the best mean over `trials` such batches (the
// least disturbed by the rest of the machine).
double seconds_per_call(const std::function<void()>& f, double min_seconds = 0.1,
                        int trials = 5);

// Times f and its anchor g in alternating rounds (best of `trials` each), so that a busy
// moment on the machine hits both sides alike. Returns {seconds per f, seconds per g}.
std::pair<double, double> seconds_per_call_pair(const std::function<void()>& f,
                                                const std::function<void()>& g,
                                                double min_seconds = 0.05, int trials = 9);

// The least total of `window` consecutive entries of `seconds` (a training step's times, say),
// leaving out the first `skip`: the run's least disturbed stretch.
double fastest_window(const std::vector<double>& seconds, size_t skip, size_t window);

// "4 B", "4 KiB", "64 MiB": a power-of-two size in its largest whole unit.
std::string size_label(size_t bytes);

// Runs a command and returns its standard output (empty if it could not run or failed).
std::optional<std::string> run_capture(const std::string& command);
// The directory holding the running executable (where sibling anchor binaries live).
std::string executable_dir();
// Extracts the number after "key": in a flat JSON line; nullopt when absent.
std::optional<double> json_number(const std::string& text, const std::string& key);
// Extracts the string after "key": in a flat JSON line (no escapes inside); nullopt when absent.
std::optional<std::string> json_string(const std::string& text, const std::string& key);

// The note of a row where PyTorch multiplies matrices: which BLAS and how many threads each side
// used, from the "blas" field of the anchor's output (bench/torch_blas.py), e.g.
// "torch on OpenBLAS 0.3.21 pthread, 1 thread; gradwire on its AVX-512 GEMM (float32; Eigen
// otherwise), 1 thread"; `threads`: gradwire's (set_num_threads) in that row.
std::string blas_note(const std::string& anchor_output, int threads = 1);

// Keeps the optimizer from deleting a computation whose result is unused.
template <typename T>
inline void do_not_optimize(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

}  // namespace gw::bench
