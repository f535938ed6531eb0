// Training gpt_train's character-level GPT on the CPU (4 blocks, 4 heads, width 128, context 128,
// batch 32: 4096 tokens a step; AdamW, warm-up and cosine, clipping: examples/common/gpt_recipe.h)
// for 200 steps on the King James Bible, beside the same model in PyTorch 1.13
// (bench/torch_anchor_gpt.py: nn.MultiheadAttention, nn.LayerNorm, GELU, the head tied to the
// embedding) started from the same weights on the same batches in the same order, both on one
// thread. Rows: training tokens/s (over the fastest 50 consecutive steps after the fifth, on
// both sides: a busy moment of the machine slows the whole of one side's run otherwise), and
// the validation loss after 100 and 200
// steps (on gpt_train's fixed validation windows; lower is better); then tokens/s of the same
// model with dropout 0.1 (after the embeddings, on the attention probabilities and after each
// residual branch, on both sides) over its first 100 steps; then tokens/s of the first case on
// two threads a side (gradwire's set_num_threads, PyTorch's and OpenBLAS's threads) over its
// first 100 steps. With GW_BENCH_GPT_CURVES=FILE, both training loss curves of the first case
// go to FILE as CSV.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "core/parallel.h"
#include "core/serialize.h"
#include "dist/data/distributed_sampler.h"
#include "examples/common/gpt_recipe.h"

namespace {

constexpr int64_t kSteps = 200, kShortSteps = 100, kBatch = 32, kContext = 128, kEvalBatches = 20,
                  kUntimed = 5, kWindow = 50;
constexpr int64_t kEvalAt[] = {100, 200};
constexpr double kDropout = 0.1;

// x, y (steps, batch, context): the batches gpt_train takes with --seed 0 on one rank.
std::pair<gw::Tensor, gw::Tensor> training_batches(const gw::data::CharWindows& train) {
  gw::dist::DistributedSampler sampler(
      train.size(), {.num_replicas = 1, .rank = 0, .seed = 0, .drop_last = true});
  const std::vector<int64_t> order = sampler.indices();
  std::vector<gw::Tensor> xs, ys;
  for (int64_t s = 0; s < kSteps; ++s) {
    auto [x, y] = train.batch(order, s * kBatch, kBatch);
    xs.push_back(x);
    ys.push_back(y);
  }
  return {gw::stack(xs), gw::stack(ys)};
}

// One case trained on both sides from the same weights on the first `steps` batches.
struct Run {
  double tokens_per_s = 0;
  std::vector<double> losses, val_losses;
  std::optional<std::string> torch_out;  // the anchor's JSON line
  std::string torch_remark;              // with several threads: PyTorch's other configuration
  std::string skipped;                   // why neither side ran
};

Run train_both(const gw::data::CharCorpus& corpus, const gw::data::CharWindows& val,
               const gw::Tensor& xs, const gw::Tensor& ys, double dropout, int threads = 1) {
  Run run;
  const int64_t steps = xs.size(0);
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::GPT>(
      gw::nn::GPTOptions{
          .vocab_size = corpus.vocab_size(), .context = kContext, .dropout = dropout},
      gen);
  const gw::examples::GPTRecipe recipe{.steps = steps, .warmup = kSteps / 10};

  // What the anchor needs: the initial weights, the batches, the validation windows.
  std::string dir = (std::filesystem::temp_directory_path() / "gw_bench_gpt_XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    run.skipped = "cannot make a temporary directory";
    return run;
  }
  {
    gw::NamedTensors file;
    for (auto& [name, t] : model->state_dict()) file["model." + name] = t.clone();
    file["x"] = xs;
    file["y"] = ys;
    const std::vector<int64_t> starts =
        gw::examples::evenly_spaced_windows(val, kEvalBatches, kBatch);
    auto [vx, vy] = val.batch(starts, 0, kEvalBatches * kBatch);
    file["val_x"] = vx;
    file["val_y"] = vy;
    std::map<std::string, std::string> metadata = gw::examples::recipe_metadata(recipe);
    metadata["heads"] = std::to_string(model->options.heads);
    metadata["dropout"] = std::to_string(dropout);
    metadata["threads"] = std::to_string(threads);
    gw::save_safetensors(dir + "/run.safetensors", file, metadata);
  }

  gw::examples::GPTTrainer trainer(model, recipe);
  const int threads_before = gw::get_num_threads();
  gw::set_num_threads(threads);
  std::vector<double> seconds;
  for (int64_t s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    run.losses.push_back(trainer.step(xs.select(0, s), ys.select(0, s)));
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (int64_t at : kEvalAt)  // the main case's (the dropout case reports tokens/s only)
      if (s + 1 == at && steps == kSteps)
        run.val_losses.push_back(gw::examples::validation_loss(*model, val, kEvalBatches, kBatch));
  }
  gw::set_num_threads(threads_before);
  const double best = gw::bench::fastest_window(seconds, kUntimed, kWindow);
  run.tokens_per_s = double(kWindow * kBatch * kContext) / best;

  // PyTorch's ops on `threads` threads, its BLAS on as many (its default) or on one, which may
  // be faster where the two pools would share the cores: the faster is the anchor.
  auto anchor = [&](int blas_threads) {
    const std::string n = std::to_string(blas_threads);  // OpenBLAS reads them as it loads
    return gw::bench::run_capture("OPENBLAS_NUM_THREADS=" + n + " OMP_NUM_THREADS=" + n +
                                  " /usr/bin/python3 " + gw::bench::executable_dir() +
                                  "/torch_anchor_gpt.py " + dir + "/run.safetensors 2>/dev/null");
  };
  run.torch_out = anchor(threads);
  if (threads > 1) {
    auto speed = [](const std::optional<std::string>& out) {
      return out ? gw::bench::json_number(*out, "tokens_per_s").value_or(0) : 0;
    };
    std::optional<std::string> one = anchor(1);
    const bool one_faster = speed(one) > speed(run.torch_out);
    if (one_faster) std::swap(one, run.torch_out);
    run.torch_remark = gw::detail::str("; torch's ops on ", threads, " threads; with its BLAS on ",
                                       one_faster ? threads : 1, ", ");
    run.torch_remark +=
        speed(one) > 0 ? std::to_string(std::llround(speed(one))) + " tokens/s" : "it failed";
  }
  std::filesystem::remove_all(dir);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  const char* curves = std::getenv("GW_BENCH_GPT_CURVES");  // a CSV file for both loss curves
  const std::string tokens_case = "char-GPT training, 4096 tokens a step";
  const std::string dropout_case = "char-GPT training with dropout 0.1, 4096 tokens a step";
  const std::string threads_case = "char-GPT training on 2 threads, 4096 tokens a step";
  const bool main_case = report.wants("gpt", tokens_case) || report.wants("gpt", "val loss");
  if (!main_case && !report.wants("gpt", dropout_case) && !report.wants("gpt", threads_case))
    return 0;

  std::optional<gw::data::CharCorpus> corpus;
  try {
    corpus = gw::data::load_bible_kjv();
  } catch (const gw::IoError& e) {
    report.skip("gpt", tokens_case, e.what());
    report.skip("gpt", dropout_case, e.what());
    report.skip("gpt", threads_case, e.what());
    return 0;
  }
  const gw::data::CharWindows train(*corpus, gw::data::CorpusSplit::Train, kContext);
  const gw::data::CharWindows val(*corpus, gw::data::CorpusSplit::Validation, kContext);
  auto [xs, ys] = training_batches(train);

  auto add = [&](const Run& run, const std::string& name, double value, const std::string& unit,
                 const std::string& key, int threads = 1) {
    if (!report.wants("gpt", name)) return;
    if (!run.skipped.empty()) return report.skip("gpt", name, run.skipped);
    const auto t = run.torch_out ? gw::bench::json_number(*run.torch_out, key) : std::nullopt;
    if (t)
      report.add({"gpt", name, value, unit, "pytorch 1.13", *t,
                  gw::bench::blas_note(*run.torch_out, threads) + run.torch_remark});
    else
      report.add({"gpt", name, value, unit, "pytorch 1.13", 0, "python3-torch not available"});
  };
  if (main_case) {
    const Run run = train_both(*corpus, val, xs, ys, 0.0);
    add(run, tokens_case, run.tokens_per_s, "tokens/s", "tokens_per_s");
    for (size_t i = 0; i < std::size(kEvalAt) && i < run.val_losses.size(); ++i)
      add(run, "val loss after " + std::to_string(kEvalAt[i]) + " steps", run.val_losses[i], "nats",
          "val_loss_" + std::to_string(kEvalAt[i]));
    if (curves) {  // step, gradwire's training loss, PyTorch's (from the anchor's line)
      std::ofstream csv(curves);
      csv << "step,gradwire,pytorch\n";
      for (size_t s = 0; s < run.losses.size(); ++s) {
        const auto t = run.torch_out
                           ? gw::bench::json_number(*run.torch_out, "loss_" + std::to_string(s))
                           : std::nullopt;
        csv << s + 1 << "," << run.losses[s] << "," << (t ? std::to_string(*t) : "") << "\n";
      }
    }
  }
  if (report.wants("gpt", dropout_case)) {
    const Run run = train_both(*corpus, val, xs.narrow(0, 0, kShortSteps),
                               ys.narrow(0, 0, kShortSteps), kDropout);
    add(run, dropout_case, run.tokens_per_s, "tokens/s", "tokens_per_s");
  }
  if (report.wants("gpt", threads_case)) {
    const Run run = train_both(*corpus, val, xs.narrow(0, 0, kShortSteps),
                               ys.narrow(0, 0, kShortSteps), 0.0, 2);
    add(run, threads_case, run.tokens_per_s, "tokens/s", "tokens_per_s", 2);
  }
  return 0;
}
