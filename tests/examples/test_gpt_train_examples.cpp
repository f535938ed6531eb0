// gpt_train end to end: real processes under gwrun (DDP, FSDP, checkpoints and resumes,
// refusals), checked on what they print and on their exit status.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "core/checkpoint.h"
#include "dist/process_group/process_group_nccl.h"
#include "tests/examples/dist_examples_util.h"
#include "tests/gwrun/gwrun_process.h"
#include "tests/process_util.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"
#include "tests/tls_pki.h"

using gw::test::check_refused;
using gw::test::count;
using gw::test::kill_worker_when;
using gw::test::Refusals;
using gw::test::run_gwrun;

namespace {

// gpt_train on a model small enough for a test: `steps` steps of 16 windows of 32 characters in
// all, however many ranks share them.
std::vector<std::string> gpt_args(int ranks, std::vector<std::string> extra = {}, int steps = 200) {
  std::vector<std::string> a = {"--nproc-per-node",
                                std::to_string(ranks),
                                GW_GPT_EXAMPLE,
                                "--width",
                                "32",
                                "--layers",
                                "1",
                                "--heads",
                                "2",
                                "--context",
                                "32",
                                "--batch-size",
                                std::to_string(16 / ranks),
                                "--steps",
                                std::to_string(steps),
                                "--eval-every",
                                std::to_string(steps / 2),
                                "--eval-batches",
                                "2",
                                "--sample",
                                "80"};
  if (ranks > 1) a.insert(a.end(), {"--ddp", "gloo"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// "step N: train loss X, val loss Y" -> the line's losses, as printed; "" if absent.
std::string gpt_losses_at(const std::string& out, int step) {
  std::smatch m;
  const std::regex line("step " + std::to_string(step) +
                        ": (train loss [0-9.]+, val loss [0-9.]+)");
  return std::regex_search(out, m, line) ? m[1].str() : "";
}

double gpt_val_loss_at(const std::string& out, int step) {
  const std::string losses = gpt_losses_at(out, step);
  return losses.empty() ? -1 : std::stod(losses.substr(losses.find("val loss ") + 9));
}

}  // namespace

TEST_CASE("gpt_train: DDP on 2 ranks trains as one process on the same global batches",
          "[examples][dist][gpt]") {
  gw::test::TempDir dir;
  const auto single = run_gwrun(gpt_args(1, {"--curve", dir.path + "/curve"}));
  INFO(single.out << single.err);
  REQUIRE(single.exit_code == 0);
  // Each rank's batch in 2 micro-batches, the gradients averaged over the ranks at the second
  // (DDP's no_sync): the same step.
  const auto ddp = run_gwrun(gpt_args(2, {"--grad-accum", "2"}));
  INFO(ddp.out << ddp.err);
  REQUIRE(ddp.exit_code == 0);
  // Learning: the validation loss falls from ln(63) = 4.14 and on between the two evaluations.
  const double val100 = gpt_val_loss_at(single.out, 100), val200 = gpt_val_loss_at(single.out, 200);
  CHECK(val100 > 0);
  CHECK(val100 < 3.5);
  CHECK(val200 < val100);
  // The same batches: the same losses but for the order of the sums (two means averaged,
  // against one mean), which 200 Adam steps may carry to the fourth decimal.
  for (int step : {100, 200}) {
    INFO("step " << step);
    CHECK(std::abs(gpt_val_loss_at(ddp.out, step) - gpt_val_loss_at(single.out, step)) < 2e-3);
  }
  CHECK(count(ddp.out, "DDP on 2 ranks (gloo)") == 1);
  CHECK(count(ddp.out, "steps of 512 tokens, each in 2 micro-batches") == 1);
  CHECK(count(ddp.out, "--- a sample (80 characters, temperature 0.8) ---") == 1);  // rank 0's
  CHECK(count(ddp.out, "] And ") == 1);  // the sample goes on from the prompt

  // Sharded instead of replicated: the same sums of the same gradients, only the clipping
  // norm is summed from shards. Then HSDP: 4 ranks as 2 replicas, each sharding the model over
  // 2, on the same global batches, in 2 micro-batches summed over the replicas at the second
  // (set_requires_all_reduce).
  auto sharded_like_ddp = [&](int ranks, const std::vector<std::string>& extra,
                              const std::string& header) {
    std::vector<std::string> a = gpt_args(ranks, extra);
    *std::find(a.begin(), a.end(), "--ddp") = "--fsdp";
    auto r = run_gwrun(a);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(count(r.out, header) == 1);
    for (int step : {100, 200}) {
      INFO("step " << step);
      CHECK(std::abs(gpt_val_loss_at(r.out, step) - gpt_val_loss_at(ddp.out, step)) < 1e-3);
    }
    return r;
  };
  // in 2 micro-batches too, without gradient sync but at the second
  const auto fsdp = sharded_like_ddp(2, {"--grad-accum", "2"}, "FSDP on 2 ranks (gloo)");
  CHECK(count(fsdp.out, "peak memory allocated in training: rank 0") == 1);
  CHECK(count(fsdp.out, "] And ") == 1);  // rank 0 printed the passage (every rank drew it)
  sharded_like_ddp(4, {"--sample", "0", "--hsdp", "2", "--grad-accum", "2"},
                   "FSDP on 4 ranks (gloo, HSDP: 2 replicas of 2 shards)");

  // The curve: a row per step, the validation loss in the rows of the steps it followed.
  std::ifstream csv(dir.path + "/curve.csv");
  std::vector<std::string> rows;
  for (std::string line; std::getline(csv, line);) rows.push_back(line);
  REQUIRE(rows.size() == 201);
  CHECK(rows[0] == "step,loss,val_loss");
  CHECK(rows[99].ends_with(","));  // step 99: no validation
  REQUIRE(rows[100].starts_with("100,"));
  CHECK(std::abs(std::stod(rows[100].substr(rows[100].rfind(',') + 1)) - val100) < 1e-4);
  CHECK(std::filesystem::file_size(dir.path + "/curve.svg") > 0);
}

TEST_CASE("gpt_train --activation-checkpointing: the same losses in less memory, alone and sharded",
          "[examples][dist][gpt]") {
  // Three blocks, so that what the blocks keep for backward (all of their activations, or
  // their inputs and one block's recomputed at a time) outweighs the rest; with dropout, so
  // that the recomputation must draw the same masks.
  auto peak_mib = [](const std::string& out) {
    std::smatch m;
    const std::regex line("peak memory allocated in training: rank 0 ([0-9.]+) MiB");
    return std::regex_search(out, m, line) ? std::stod(m[1].str()) : -1.0;
  };
  for (int ranks : {1, 2}) {
    std::vector<std::string> args =
        gpt_args(ranks, {"--layers", "3", "--dropout", "0.1", "--sample", "0"}, 20);
    if (ranks == 2) *std::find(args.begin(), args.end(), "--ddp") = "--fsdp";
    const auto kept = run_gwrun(args);
    args.insert(args.end(), {"--activation-checkpointing", "on"});
    const auto recomputed = run_gwrun(args);
    INFO(kept.out << kept.err << recomputed.out << recomputed.err);
    REQUIRE(kept.exit_code == 0);
    REQUIRE(recomputed.exit_code == 0);
    CHECK(!gpt_losses_at(kept.out, 20).empty());
    for (int step : {10, 20})
      CHECK(gpt_losses_at(recomputed.out, step) == gpt_losses_at(kept.out, step));
    CHECK(peak_mib(recomputed.out) > 0);
    CHECK(peak_mib(recomputed.out) < 0.8 * peak_mib(kept.out));
  }
}

TEST_CASE(
    "gpt_train: a rank killed mid-run resumes from the checkpoint and ends as if never "
    "stopped; another run's or a corrupt checkpoint is refused",
    "[examples][dist][gpt]") {
  // Long enough (about 3 s) for the kill to land mid-run. The reference runs on 2 ranks too, so
  // that every sum is made in the same order and the losses agree to the last printed digit;
  // with dropout, so that the resumed run must also draw the masks the reference drew.
  constexpr int kSteps = 1000;
  gw::test::TempDir dir;
  const auto reference = run_gwrun(gpt_args(2, {"--sample", "0", "--dropout", "0.1"}, kSteps));
  REQUIRE(reference.exit_code == 0);

  std::vector<std::string> args =
      gpt_args(2,
               {"--sample", "0", "--dropout", "0.1", "--checkpoint-every", "20", "--checkpoint-dir",
                dir.path},
               kSteps);
  args.insert(args.begin(), {"--max-restarts", "1"});
  const auto [r, victim] = kill_worker_when(args, "checkpoint saved: step 20", 1);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.err, "restarting all workers (restart 1 of 1)") == 1);
  CHECK(count(r.out, "resuming from " + dir.path + " at step ") == 1);
  CHECK(count(r.out, "checkpoint saved: step 1000") == 1);
  CHECK(gpt_losses_at(r.out, kSteps) == gpt_losses_at(reference.out, kSteps));
  CHECK(!gpt_losses_at(r.out, kSteps).empty());

  // The same directory for a wider model: refused, naming the difference.
  const auto other = run_gwrun(gpt_args(1,
                                        {"--width", "64", "--dropout", "0.1", "--checkpoint-every",
                                         "20", "--checkpoint-dir", dir.path},
                                        kSteps));
  CHECK(other.exit_code != 0);
  CHECK(count(other.err, "is of another run: its width is 32, this run's 64") == 1);
  // A torn file (a copy cut short, not one save_checkpoint wrote): refused with the reason.
  std::filesystem::resize_file(dir.path + "/checkpoint.safetensors", 100);
  const auto torn =
      run_gwrun(gpt_args(1, {"--checkpoint-every", "20", "--checkpoint-dir", dir.path}, kSteps));
  CHECK(torn.exit_code != 0);
  CHECK(count(torn.err, "checkpoint.safetensors: header length") == 1);
}

TEST_CASE(
    "gpt_train --fsdp: a sharded checkpoint saved by 2 ranks resumes on 4, each rank "
    "reading its own rows; under HSDP (2 replicas of 2) too",
    "[examples][dist][gpt]") {
  auto check = [](int save_ranks, std::vector<std::string> save_extra, int load_ranks,
                  std::vector<std::string> load_extra) {
    gw::test::TempDir dir;
    auto sharded = [&](int ranks, const std::vector<std::string>& extra) {
      std::vector<std::string> a = gpt_args(
          ranks, {"--sample", "0", "--checkpoint-every", "100", "--checkpoint-dir", dir.path});
      *std::find(a.begin(), a.end(), "--ddp") = "--fsdp";
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    const auto saved = run_gwrun(sharded(save_ranks, save_extra));
    INFO(saved.out << saved.err);
    REQUIRE(saved.exit_code == 0);
    CHECK(std::filesystem::exists(dir.path + "/sharded/index.json"));
    const auto resumed = run_gwrun(sharded(load_ranks, load_extra));  // a global batch of 16
    INFO(resumed.out << resumed.err);
    REQUIRE(resumed.exit_code == 0);
    CHECK(count(resumed.out, "resuming from " + dir.path + " at step 200") == 1);
    // Only the validation runs again, on the loaded rows: the same loss.
    std::smatch m;
    REQUIRE(std::regex_search(resumed.out, m, std::regex("\\] val loss ([0-9.]+)")));
    CHECK(std::abs(std::stod(m[1]) - gpt_val_loss_at(saved.out, 200)) < 1e-4);
    if (load_ranks != 4 || !load_extra.empty()) return;
    // Without --fsdp the run would start afresh beside the sharded checkpoint: refused, naming it.
    std::vector<std::string> plain = sharded(2, {});
    *std::find(plain.begin(), plain.end(), "--fsdp") = "--ddp";
    const auto other = run_gwrun(plain);
    CHECK(other.exit_code != 0);
    CHECK(count(other.err, "sharded/index.json is the checkpoint of a run with --fsdp") >= 1);
    // A step that is not a whole number is a damaged checkpoint, not step 200: the index's
    // checksum no longer holds.
    const std::string index = dir.path + "/sharded/index.json";
    std::string text;
    {
      std::ifstream in(index);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string damaged =
        std::regex_replace(text, std::regex("(\"step\": *\")200\""), "$01200x\"");
    REQUIRE(damaged != text);
    std::ofstream(index) << damaged;
    const auto bad = run_gwrun(sharded(2, {}));
    CHECK(bad.exit_code != 0);
    CHECK(count(bad.err, "sharded/index.json: is corrupt: its CRC-32C") >= 1);
    // ... and with the checksum made to fit, gpt_train's own check of the step refuses it.
    std::string refit = damaged;
    const std::string field = "\"crc32c\": \"";
    REQUIRE(refit.find(field) != std::string::npos);
    const size_t digits = refit.find(field) + field.size();
    refit.replace(digits, 8, "00000000");
    std::ofstream(index) << refit.replace(
        digits, 8, gw::crc32c_hex(gw::crc32c(0, refit.data(), refit.size())));
    const auto stepless = run_gwrun(sharded(2, {}));
    CHECK(stepless.exit_code != 0);
    CHECK(count(stepless.err, "has step \"200x\", not a whole number") >= 1);
  };
  check(2, {}, 4, {});
  check(4, {"--hsdp", "2"}, 2, {});  // the replicas' equal rows written once
  check(2, {}, 4, {"--hsdp", "2"});  // each replica reads its rows
}

TEST_CASE("gpt_train on a GPU: --ddp nccl, and --fsdp nccl --cpu-offload on in bfloat16",
          "[examples][dist][gpt][cuda]") {
  std::string why;
  if (!gw::dist::nccl_available(&why)) GW_SKIP(why);
  const std::vector<std::pair<std::vector<std::string>, std::string>> runs{
      {{"--device", "cuda", "--ddp", "nccl"}, "DDP on 1 ranks (nccl, cuda:0)"},
      {{"--device", "cuda", "--fsdp", "nccl", "--cpu-offload", "on", "--amp", "bf16"},
       "FSDP on 1 ranks (nccl, cuda:0, shards in host memory), bfloat16 autocast"},
  };
  for (const auto& [extra, says] : runs) {
    const auto r = run_gwrun(gpt_args(1, extra, 100));
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(count(r.out, says) == 1);
    const double half = gpt_val_loss_at(r.out, 50), end = gpt_val_loss_at(r.out, 100);
    CHECK(half > 0);
    CHECK(end > 0);
    CHECK(end < half);  // it learns
  }
}

TEST_CASE("gpt_train --device cuda --fsdp nccl without a GPU fails at once, naming the cause",
          "[examples][dist][gpt]") {
  if (gw::dist::nccl_available()) GW_SKIP("a CUDA device is present");
  const auto r = run_gwrun(gpt_args(1, {"--device", "cuda", "--fsdp", "nccl"}, 10));
  INFO(r.out << r.err);
  CHECK(r.exit_code != 0);
  CHECK(count(r.err, "gpt_train (rank 0): ") == 1);
  CHECK(count(r.err, "no CUDA device") + count(r.err, "has no NCCL") == 1);
  CHECK(count(r.out, "parameters") == 0);
}

TEST_CASE("gpt_train refuses flags that do not fit together, before anything starts",
          "[examples][dist][gpt]") {
  const Refusals cases{
      {{"--fsdp", "nccl"}, "add --device cuda"},
      {{"--ddp", "nccl"}, "add --device cuda"},
      {{"--device", "cuda", "--ddp", "nccl", "--cpu-offload", "on"}, "it takes --fsdp nccl"},
      {{"--pp", "2", "--ddp", "nccl"}, "with --pp, --ddp and --fsdp take gloo or mpi"},
      {{"--device", "cuda", "--ddp", "gloo"}, "--ddp nccl or --fsdp nccl"},
      {{"--fsdp", "gloo", "--cpu-offload", "on"}, "it takes --fsdp nccl and --device cuda"},
      {{"--device", "cuda", "--ddp", "nccl", "--checkpoint-every", "10"},
       "do not take --checkpoint-every"},
      {{"--ddp", "gloo", "--hsdp", "2"}, "it takes --fsdp, not --pp"},
      {{"--fsdp", "gloo", "--hsdp", "1"}, "into R >= 2 replicas"},
      {{"--grad-accum", "3"}, "--batch-size must split into --grad-accum micro-batches"},
      {{"--grad-accum", "0"}, "--grad-accum must be at least 1"},
      {{"--pp", "2", "--grad-accum", "2"}, "drop --grad-accum"},
      {{"--pp", "2", "--activation-checkpointing", "on"},
       "--pp does not take --activation-checkpointing"},
      {{"--lr", "inf"}, "--lr must be positive and finite"},
      {{"--weight-decay", "nan"}, "--weight-decay must be finite and >= 0"},
      {{"--eval-batches", "100000000000"}, "--eval-batches in [1, 100000]"},
  };
  check_refused(GW_GPT_EXAMPLE, cases, "parameters");
}

TEST_CASE(
    "gpt_train --pp: a pipeline of 2 ranks trains as the whole model in one, under 1F1B "
    "and zero bubble, and so do two replicas of it on 4 ranks (--pp 2 --ddp, --pp 2 --fsdp)",
    "[examples][dist][gpt][pipeline]") {
  gw::test::TempDir dir;
  // Long enough for a pipeline that loses or misplaces a gradient to part from the whole model
  // by more than the tolerance below at the first evaluation.
  constexpr int kSteps = 60;
  auto piped = [](int ranks, const std::string& schedule, std::vector<std::string> more = {}) {
    std::vector<std::string> a = gpt_args(1, {"--sample", "0", "--layers", "2"}, kSteps);
    a[1] = std::to_string(ranks);  // --nproc-per-node: every rank sees the whole batch
    a.insert(a.end(),
             {"--pp", std::to_string(ranks), "--schedule", schedule, "--microbatches", "4"});
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const auto whole = run_gwrun(piped(1, "1f1b"));  // one stage: the whole (untied) model
  INFO(whole.out << whole.err);
  REQUIRE(whole.exit_code == 0);
  for (int step : {kSteps / 2, kSteps}) REQUIRE(gpt_val_loss_at(whole.out, step) > 0);
  for (const char* schedule : {"1f1b", "zb"}) {
    const auto two = run_gwrun(piped(2, schedule, {"--curve", dir.path + "/" + schedule}));
    INFO(schedule << "\n" << two.out << two.err);
    REQUIRE(two.exit_code == 0);
    CHECK(count(two.out, std::string("a pipeline of 2 ranks (") + schedule) == 1);
    for (int step : {kSteps / 2, kSteps}) {
      INFO("step " << step);
      CHECK(std::abs(gpt_val_loss_at(two.out, step) - gpt_val_loss_at(whole.out, step)) < 2e-3);
    }
  }
  // In bfloat16 autocast: each rank's stages run their forwards under it, the same products
  // rounded alike as in one process (1F1B and zero bubble), and not the float32 run's: 1F1B's
  // losses step by step.
  const auto whole_bf16 = run_gwrun(piped(1, "1f1b", {"--amp", "bf16"}));
  const auto two_bf16 =
      run_gwrun(piped(2, "1f1b", {"--amp", "bf16", "--curve", dir.path + "/bf16"}));
  INFO(whole_bf16.out << whole_bf16.err << two_bf16.out << two_bf16.err);
  REQUIRE(whole_bf16.exit_code == 0);
  REQUIRE(two_bf16.exit_code == 0);
  for (int step : {kSteps / 2, kSteps}) REQUIRE(gpt_val_loss_at(whole_bf16.out, step) > 0);
  CHECK(count(two_bf16.out, "bfloat16 autocast over float32 parameters") == 1);
  // Zero bubble too: its I and W split each backward, with autocast's casts recorded.
  const auto zb_bf16 = run_gwrun(piped(2, "zb", {"--amp", "bf16"}));
  INFO(zb_bf16.out << zb_bf16.err);
  REQUIRE(zb_bf16.exit_code == 0);
  for (int step : {kSteps / 2, kSteps}) {
    INFO("step " << step);
    const double whole = gpt_val_loss_at(whole_bf16.out, step);
    CHECK(std::abs(gpt_val_loss_at(two_bf16.out, step) - whole) < 2e-3);
    CHECK(std::abs(gpt_val_loss_at(zb_bf16.out, step) - whole) < 2e-3);
  }
  auto rows = [](const std::string& csv) {
    std::ifstream in(csv);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  const std::vector<std::string> f32_rows = rows(dir.path + "/1f1b.csv");
  const std::vector<std::string> bf16_rows = rows(dir.path + "/bf16.csv");
  REQUIRE(f32_rows.size() == kSteps + 1);
  REQUIRE(bf16_rows.size() == kSteps + 1);
  CHECK(f32_rows != bf16_rows);
  // 2D: two replicas of the 2-rank pipeline on 4 ranks, each on half of every batch.
  std::vector<std::string> a =
      gpt_args(2, {"--sample", "0", "--layers", "2"}, kSteps);  // 8 windows a replica
  a[1] = "4";
  a.insert(a.end(), {"--pp", "2", "--schedule", "1f1b", "--microbatches", "4"});
  const auto two_by_two = run_gwrun(a);
  INFO(two_by_two.out << two_by_two.err);
  REQUIRE(two_by_two.exit_code == 0);
  CHECK(count(two_by_two.out, "2 replicas of a pipeline of 2 ranks (1f1b") == 1);
  for (int step : {kSteps / 2, kSteps})
    CHECK(std::abs(gpt_val_loss_at(two_by_two.out, step) - gpt_val_loss_at(whole.out, step)) <
          2e-3);
  // The same with each stage sharded over the two replicas.
  *std::find(a.begin(), a.end(), "--ddp") = "--fsdp";
  const auto sharded = run_gwrun(a);
  INFO(sharded.out << sharded.err);
  REQUIRE(sharded.exit_code == 0);
  CHECK(count(sharded.out, "each stage sharded over the replicas (FSDP)") == 1);
  for (int step : {kSteps / 2, kSteps})
    CHECK(std::abs(gpt_val_loss_at(sharded.out, step) - gpt_val_loss_at(whole.out, step)) < 2e-3);
}

TEST_CASE("gpt_train: a checkpoint saved by 2 ranks resumes on 1 with the same global batch",
          "[examples][dist][gpt]") {
  constexpr int kSteps = 1000;
  gw::test::TempDir dir;
  const std::vector<std::string> checkpoint = {
      "--sample", "0", "--checkpoint-every", "20", "--checkpoint-dir", dir.path};
  // Two ranks of 8 windows, one killed after step 20's checkpoint: no restarts, the job fails.
  const auto [killed, victim] =
      kill_worker_when(gpt_args(2, checkpoint, kSteps), "checkpoint saved: step 20", 1);
  INFO(killed.out << killed.err);
  REQUIRE(killed.exit_code != 0);
  // One rank of 16 windows goes on from the last checkpoint, on the same batches.
  const auto resumed = run_gwrun(gpt_args(1, checkpoint, kSteps));
  INFO(resumed.out << resumed.err);
  CHECK(resumed.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(resumed.out, m, std::regex("resuming from .* at step ([0-9]+)")));
  CHECK(std::stoi(m[1]) >= 20);
  CHECK(std::stoi(m[1]) < kSteps);
  const auto reference = run_gwrun(gpt_args(1, {"--sample", "0"}, kSteps));
  REQUIRE(reference.exit_code == 0);
  const double want = gpt_val_loss_at(reference.out, kSteps);
  const double got = gpt_val_loss_at(resumed.out, kSteps);
  INFO("uninterrupted " << want << ", resumed on another number of ranks " << got);
  CHECK(got > 0);
  CHECK(std::abs(got - want) < 2e-3);
}
