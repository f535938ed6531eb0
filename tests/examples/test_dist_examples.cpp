// The distributed examples but gpt_train (test_gpt_train_examples.cpp), end to end: real
// processes under gwrun, checked on what they print and on their exit status.
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

TEST_CASE("the design note's end-to-end example passes its own check on both workers",
          "[examples][dist]") {
  auto r = run_gwrun({"--nproc-per-node", "2", GW_SEED_EXAMPLE});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "moved by -0.05 x gradient: yes") == 4);
  CHECK(count(r.out, "gradient [1 1 1 1 1 1 1 1 1]") == 4);  // d(sum(a + b))/da = 1
  CHECK(count(r.out, "check passed") == 2);
}

TEST_CASE("the SMART mode example: FAST mode raises, SMART mode equals local autograd",
          "[examples][dist]") {
  auto r = run_gwrun({"--nproc-per-node", "2", GW_SMART_EXAMPLE});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "FAST mode raised") == 1);
  CHECK(count(r.out, "equals local autograd's") == 2);
  CHECK(count(r.out, "c has no gradient") == 1);
  CHECK(count(r.out, "check passed") == 2);
}

TEST_CASE("the design note's example runs under TLS named by the environment alone",
          "[examples][dist]") {
  gw::test::Pki pki, other;
  const gw::store::TlsOptions tls = pki.issue("node");
  auto run = [&](const std::string& ca) {
    ::setenv("GW_TLS_CERT_FILE", tls.cert_file.c_str(), 1);
    ::setenv("GW_TLS_KEY_FILE", tls.key_file.c_str(), 1);
    ::setenv("GW_TLS_CA_FILE", ca.c_str(), 1);
    auto r = run_gwrun({"--nproc-per-node", "2", GW_SEED_EXAMPLE});
    for (const char* v : {"GW_TLS_CERT_FILE", "GW_TLS_KEY_FILE", "GW_TLS_CA_FILE"}) ::unsetenv(v);
    return r;
  };
  auto r = run(tls.ca_file);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "check passed") == 2);
  // Trusting another CA, the workers cannot reach each other: TLS was on.
  auto refused = run(other.issue("other").ca_file);
  INFO(refused.out << refused.err);
  CHECK(refused.exit_code != 0);
  CHECK(count(refused.out + refused.err, "TLS") > 0);
}

TEST_CASE("the parameter server trains a model with two trainers", "[examples][dist]") {
  // A short run on 6400 samples: well above chance (10%), far from the full run's 85%.
  auto r = run_gwrun({"--nproc-per-node", "3", GW_PS_EXAMPLE, "--epochs", "1", "--limit", "6400",
                      "--target", "0.6"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "trainer0: mean loss") == 1);
  CHECK(count(r.out, "trainer1: mean loss") == 1);
  CHECK(count(r.out, "test accuracy") == 1);
}

TEST_CASE("the model-parallel trainer trains a model split across two workers",
          "[examples][dist]") {
  auto r = run_gwrun({"--nproc-per-node", "3", GW_MP_EXAMPLE, "--epochs", "1", "--limit", "6400",
                      "--target", "0.6"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "epoch 1: test accuracy") == 1);
}

TEST_CASE("DDP training keeps the replicas identical", "[examples][dist][ddp]") {
  // A short run on 3200 samples: above chance, with bit-identical replicas on both ranks.
  auto r = run_gwrun({"--nproc-per-node", "2", GW_DDP_EXAMPLE, "--epochs", "1", "--limit", "3200",
                      "--target", "0.5"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "parameters identical to rank 0's: yes") == 2);
  CHECK(count(r.out, "epoch 1: test accuracy") == 1);  // rank 0 only
}

namespace {
// "test accuracy 74.48%" -> 74.48; -1 if absent.
double final_accuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("\\] test accuracy ([0-9.]+)%"))) return -1;
  return std::stod(m[1]);
}
}  // namespace

TEST_CASE("ddp_train --fsdp on trains as DDP does, each rank holding half the model",
          "[examples][dist][ddp][fsdp]") {
  const std::vector<std::string> args{"--nproc-per-node", "2",    GW_DDP_EXAMPLE, "--epochs", "1",
                                      "--limit",          "3200", "--target",     "0.5"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const auto ddp = run_gwrun(args);
  const auto fsdp = run_gwrun(with({"--fsdp", "on"}));
  INFO(ddp.out << ddp.err << fsdp.out << fsdp.err);
  REQUIRE(ddp.exit_code == 0);
  REQUIRE(fsdp.exit_code == 0);
  CHECK(count(fsdp.out, "FSDP on 2 ranks (gloo)") == 1);
  CHECK(count(fsdp.out, "holds 1/2 of the parameters") == 2);
  // The same initial weights, batches and averaged gradients: the same model.
  CHECK(std::abs(final_accuracy(fsdp.out) - final_accuracy(ddp.out)) < 0.05);
  CHECK(final_accuracy(fsdp.out) > 50);
  const auto refused = run_gwrun(with({"--fsdp", "on", "--zero", "on"}));
  CHECK(refused.exit_code != 0);
  CHECK(count(refused.err, "drop --zero and --hook") >= 1);
}

TEST_CASE("ddp_train --device cuda trains over NCCL on a GPU", "[examples][dist][ddp][cuda]") {
  std::string why;
  if (!gw::dist::nccl_available(&why)) GW_SKIP(why);
  const auto r = run_gwrun({"--nproc-per-node", "1", GW_DDP_EXAMPLE, "--device", "cuda", "--epochs",
                            "1", "--limit", "3200", "--target", "0.5"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "DDP on 1 ranks (nccl, cuda:0)") == 1);
  CHECK(count(r.out, "parameters identical to rank 0's: yes") == 1);
  CHECK(final_accuracy(r.out) > 50);
}

TEST_CASE("ddp_train --device cuda without a GPU fails at once, naming the cause",
          "[examples][dist][ddp]") {
  if (gw::dist::nccl_available()) GW_SKIP("a CUDA device is present");
  const auto r = run_gwrun({"--nproc-per-node", "1", GW_DDP_EXAMPLE, "--device", "cuda", "--epochs",
                            "1", "--limit", "3200"});
  INFO(r.out << r.err);
  CHECK(r.exit_code != 0);
  CHECK(count(r.err, "ddp_train (rank 0): ") == 1);
  CHECK(count(r.err, "no CUDA device") + count(r.err, "has no NCCL") == 1);
  CHECK(count(r.out, "test accuracy") == 0);
}

TEST_CASE("ddp_train refuses what --device cuda does not take, before anything starts",
          "[examples][dist][ddp]") {
  const Refusals cases{
      {{"--device", "cuda", "--zero", "on"}, "run on the CPU"},
      {{"--device", "cuda", "--backend", "gloo"}, "drop --backend"},
      {{"--backend", "nccl"}, "usage"},  // not a --backend value: --device cuda chooses it
  };
  check_refused(GW_DDP_EXAMPLE, cases, "DDP on");
}

TEST_CASE("gwrun --max-restarts: DDP with a rank killed mid-epoch resumes from its checkpoint",
          "[examples][dist][ddp]") {
  gw::test::TempDir uninterrupted, resumed;
  auto args = [](const std::string& dir) {
    return std::vector<std::string>{"--max-restarts",
                                    "2",
                                    "--nproc-per-node",
                                    "2",
                                    GW_DDP_EXAMPLE,
                                    "--epochs",
                                    "2",
                                    "--limit",
                                    "3600",
                                    "--target",
                                    "0.5",
                                    "--checkpoint-every",
                                    "10",
                                    "--checkpoint-dir",
                                    dir};
  };
  const auto reference = run_gwrun(args(uninterrupted.path));
  INFO(reference.out << reference.err);
  REQUIRE(reference.exit_code == 0);
  REQUIRE(count(reference.err, "restarting") == 0);

  const auto [r, victim] =  // mid second epoch
      kill_worker_when(args(resumed.path), "checkpoint saved: epoch 2, step 20", 1);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.err, "rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9") == 1);
  CHECK(count(r.err, "restarting all workers (restart 1 of 2)") == 1);
  CHECK(count(r.out, "resuming from " + resumed.path + " at epoch 2, step ") == 1);
  CHECK(count(r.out, "parameters identical to rank 0's: yes") >= 2);
  const double want = final_accuracy(reference.out), got = final_accuracy(r.out);
  INFO("uninterrupted " << want << "%, resumed " << got << "%");
  CHECK(got > 0);
  CHECK(std::abs(got - want) <= 0.5);
}

TEST_CASE("DDP with ZeRO: a checkpoint saved by 2 ranks resumes on 3 as if uninterrupted",
          "[examples][dist][ddp]") {
  // 96 samples a step either way (48 per rank on 2, 32 on 3): every step averages the same
  // samples, so the run that moved from 2 ranks to 3 after its first epoch ends where the run
  // that stayed on 2 does.
  gw::test::TempDir uninterrupted, moved;
  auto args = [](const std::string& nproc, const std::string& batch, const std::string& epochs,
                 const std::string& dir) {
    return std::vector<std::string>{"--nproc-per-node",
                                    nproc,
                                    GW_DDP_EXAMPLE,
                                    "--zero",
                                    "on",
                                    "--epochs",
                                    epochs,
                                    "--batch-size",
                                    batch,
                                    "--limit",
                                    "3600",
                                    "--target",
                                    "0.5",
                                    "--checkpoint-every",
                                    "1000",
                                    "--checkpoint-dir",
                                    dir};
  };
  const auto reference = run_gwrun(args("2", "48", "2", uninterrupted.path));
  INFO(reference.out << reference.err);
  REQUIRE(reference.exit_code == 0);
  const auto first = run_gwrun(args("2", "48", "1", moved.path));
  INFO(first.out << first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(count(first.out, "checkpoint saved: epoch 2, step 0") == 1);
  const auto second = run_gwrun(args("3", "32", "2", moved.path));
  INFO(second.out << second.err);
  CHECK(second.exit_code == 0);
  CHECK(count(second.out,
              "resuming from " + moved.path + " at epoch 2, step 0 (saved by 2 ranks)") == 1);
  CHECK(count(second.out, "parameters identical to rank 0's: yes") == 3);
  CHECK(count(second.out, "epoch 1: test accuracy") == 0);  // the first epoch was not run again
  const double want = final_accuracy(reference.out), got = final_accuracy(second.out);
  INFO("uninterrupted " << want << "%, moved to 3 ranks " << got << "%");
  CHECK(got > 0);
  CHECK(std::abs(got - want) <= 0.1);
}

TEST_CASE("gwrun --max-restarts: the parameter server resumes after a trainer is killed",
          "[examples][dist]") {
  gw::test::TempDir dir;
  const auto [r, victim] = kill_worker_when(
      {"--max-restarts", "2", "--nproc-per-node", "3", GW_PS_EXAMPLE, "--epochs", "2", "--limit",
       "6400", "--target", "0.6", "--checkpoint-every", "20", "--checkpoint-dir", dir.path},
      "checkpoint saved: epoch 1, step 20", 2);  // rank 2: trainer1
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);  // the test accuracy reached the target
  CHECK(count(r.err, "rank 2 (pid " + std::to_string(victim) + ") was killed by signal 9") == 1);
  CHECK(count(r.err, "restarting all workers (restart 1 of 2)") == 1);
  // The restarted server picks up the last checkpoint saved before the kill took effect.
  CHECK(count(r.out, "resuming from " + dir.path + " at epoch ") == 1);
  CHECK(count(r.out, "checkpoint saved: epoch 3, step 0") == 1);
  CHECK(count(r.out, "test accuracy") == 1);
}

TEST_CASE("an example in a broken environment fails with one line and an exit code, no abort",
          "[examples][dist]") {
  // RANK without WORLD_SIZE; then a port that is not one.
  for (const std::vector<std::string>& env :
       {std::vector<std::string>{"RANK=0"},
        std::vector<std::string>{"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                                 "MASTER_PORT=99999"}}) {
    for (const char* example : {GW_SEED_EXAMPLE, GW_RPC_BASICS}) {
      std::vector<std::string> argv = {"/usr/bin/env", "-u", "WORLD_SIZE"};
      argv.insert(argv.end(), env.begin(), env.end());
      argv.push_back(example);
      INFO(example << " with " << env.back());
      const int code = gw::test::wait_exit(gw::test::spawn(argv));
      CHECK(code > 0);
      CHECK(code < 128);  // an exit, not a signal (SIGABRT would be 134)
    }
  }
}
