// Core benchmarks: GEMM against raw Eigen, elementwise add against memcpy bandwidth, the
// dispatch overhead of a one-element add against libtorch 1.13 (measured in the same run by
// the torch_anchor_core binary when it was built, else its published figure), and
// cross-entropy and log_softmax of float32 logits against PyTorch 1.13 in the same run
// (bench/torch_anchor_softmax.py): the char-GPT's (4096 x 65) and a word vocabulary's.
#include <Eigen/Core>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness.h"
#include "core/ops.h"
#include "nn/functional.h"

namespace {

using gw::bench::Reporter;
using gw::bench::seconds_per_call;

void bench_gemm(Reporter& report) {
  for (int64_t n : {64, 128, 256, 512, 1024, 2048}) {
    std::string name = "f32 " + std::to_string(n);
    if (!report.wants("gemm", name)) continue;
    gw::Generator gen(n);
    gw::Tensor a = gw::randn({n, n}, gen), b = gw::randn({n, n}, gen);
    using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const Mat> A(a.data_ptr<float>(), n, n), B(b.data_ptr<float>(), n, n);
    Mat C(n, n);
    auto [t, r] = gw::bench::seconds_per_call_pair(
        [&] { gw::bench::do_not_optimize(gw::mm(a, b)); },
        [&] {
          C.noalias() = A * B;
          gw::bench::do_not_optimize(C.data());
        });
    double flop = 2.0 * n * n * n;
    report.add({"gemm", name, flop / t / 1e9, "GFLOP/s", "eigen", flop / r / 1e9});
  }
}

void bench_add(Reporter& report) {
  constexpr int64_t kElems = 16 << 20;  // 64 MiB of float32 per operand
  constexpr double kBytes = kElems * 4.0;
  gw::Generator gen(1);
  gw::Tensor x = gw::rand({kElems}, gen), y = gw::rand({kElems}, gen);
  gw::Tensor out = gw::zeros({kElems});
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  auto copy = [&] {
    std::memcpy(dst.data(), src.data(), src.size());
    gw::bench::do_not_optimize(dst.data());
  };
  // Bandwidth counts every byte read and written: 2 streams for memcpy, 3 for add.
  if (report.wants("add", "64MiB out=")) {
    auto [t, m] = gw::bench::seconds_per_call_pair([&] { gw::add_out(out, x, y); }, copy);
    report.add({"add", "64MiB out=", 3 * kBytes / t / 1e9, "GB/s", "memcpy", 2 * kBytes / m / 1e9});
  }
  if (report.wants("add", "64MiB new output")) {
    auto [t, m] = gw::bench::seconds_per_call_pair(
        [&] { gw::bench::do_not_optimize(gw::add(x, y)); }, copy);
    report.add({"add", "64MiB new output", 3 * kBytes / t / 1e9, "GB/s", "memcpy",
                2 * kBytes / m / 1e9,
                "the output block comes from the allocator's cache: no page faults"});
  }
}

void bench_dispatch(Reporter& report) {
  gw::Tensor a = gw::ones({1}), b = gw::ones({1});
  double out_of_place = seconds_per_call([&] { gw::bench::do_not_optimize(gw::add(a, b)); });
  double in_place = seconds_per_call([&] { a.add_(b); });

  // libtorch 1.13 measured now by the sibling anchor binary, when it was built.
  std::optional<double> torch_add, torch_add_;
  auto anchor_out = gw::bench::run_capture(gw::bench::executable_dir() + "/torch_anchor_core");
  if (anchor_out) {
    torch_add = gw::bench::json_number(*anchor_out, "add_ns");
    torch_add_ = gw::bench::json_number(*anchor_out, "add_inplace_ns");
  }
  constexpr double kPublishedNs = 520;  // libtorch 1.13, 1-element add, as published
  const char* note = torch_add ? "" : gw::bench::kPublishedFigure;
  if (report.wants("dispatch", "add 1 elem")) {
    report.add({"dispatch", "add 1 elem", out_of_place * 1e9, "ns", "libtorch 1.13",
                torch_add.value_or(kPublishedNs), note});
  }
  if (report.wants("dispatch", "add_ 1 elem")) {
    report.add({"dispatch", "add_ 1 elem", in_place * 1e9, "ns", "libtorch 1.13",
                torch_add_.value_or(kPublishedNs), note});
  }
}

// (rows, classes) of logits: gpt_train's batch of 4096 tokens over its 65 characters, and over
// a vocabulary of 8192 words.
constexpr std::pair<int64_t, int64_t> kLogits[] = {{4096, 65}, {4096, 8192}};

void bench_softmax(Reporter& report) {
  std::string cases;
  bool wanted = false;
  for (auto [rows, classes] : kLogits) {
    const std::string shape = std::to_string(rows) + "x" + std::to_string(classes);
    cases += " " + shape;
    wanted |= report.wants("softmax", "cross_entropy fwd+bwd " + shape) ||
              report.wants("softmax", "log_softmax " + shape);
  }
  if (!wanted) return;
  const auto torch_out =
      gw::bench::run_capture("/usr/bin/python3 " + gw::bench::executable_dir() +
                             "/torch_anchor_softmax.py" + cases + " 2>/dev/null");
  auto add = [&](const std::string& name, const std::string& key, double seconds) {
    const auto torch_us = torch_out ? gw::bench::json_number(*torch_out, key) : std::nullopt;
    report.add({"softmax", name, seconds * 1e6, "us", "pytorch 1.13", torch_us.value_or(0),
                torch_us ? "one thread each side" : "python3-torch not available"});
  };
  gw::Generator gen(2);
  for (auto [rows, classes] : kLogits) {
    const std::string shape = std::to_string(rows) + "x" + std::to_string(classes);
    gw::Tensor logits = gw::randn({rows, classes}, gen).requires_grad_();
    const gw::Tensor target = gw::randint(0, classes, {rows}, gen);
    if (report.wants("softmax", "cross_entropy fwd+bwd " + shape)) {
      add("cross_entropy fwd+bwd " + shape, "ce_" + shape + "_us", seconds_per_call([&] {
            gw::nn::functional::cross_entropy(logits, target).backward();
            logits.set_grad({});
          }));
    }
    if (report.wants("softmax", "log_softmax " + shape)) {
      const gw::Tensor x = logits.detach();
      add("log_softmax " + shape, "lsm_" + shape + "_us",
          seconds_per_call([&] { gw::bench::do_not_optimize(gw::log_softmax(x, 1)); }));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Reporter report(argc, argv);
  bench_dispatch(report);
  bench_add(report);
  bench_gemm(report);
  bench_softmax(report);
  return 0;
}
