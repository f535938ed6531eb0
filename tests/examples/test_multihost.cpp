// The distributed examples across hosts: three network namespaces on a bridge (tests/netns_bed.h),
// one gwrun per "host" with --nnodes 3 --node-rank i --master-addr <host 0>, as a user runs a job
// on three machines. Needs root (CI has it); skips elsewhere.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <regex>

#include "store/liveness.h"
#include "tests/gwrun/gwrun_process.h"
#include "tests/key_file.h"
#include "tests/netns_bed.h"
#include "tests/scoped_env.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

using gw::test::count;
using gw::test::GwrunProcess;
using gw::test::GwrunResult;
using gw::test::NetnsBed;

namespace {

// The job's key, shared by every node as GW_JOB_KEY_FILE (README "Running on several machines").
struct SharedKey : gw::test::KeyFile {
  SharedKey() : KeyFile(/*export_env=*/true) {}
};

// Every gwrun's result, collected concurrently: one blocked on a full pipe would stall the job.
std::vector<GwrunResult> finish_all(std::vector<std::unique_ptr<GwrunProcess>>& hosts) {
  std::vector<std::future<GwrunResult>> done;
  for (auto& h : hosts)
    done.push_back(std::async(std::launch::async, [&h] { return h->finish(); }));
  std::vector<GwrunResult> results;
  for (auto& d : done) results.push_back(d.get());
  return results;
}

// `program` across every host of `bed`, `nproc` workers each, host 0 the master (named by its
// IPv4 address, IPv6 address or host name); each host's gwrun result.
enum class Master { kIpv4, kIpv6, kName };

std::vector<std::unique_ptr<GwrunProcess>> start_across(const NetnsBed& bed, int nproc,
                                                        const std::vector<std::string>& program,
                                                        Master master = Master::kIpv4) {
  std::vector<std::unique_ptr<GwrunProcess>> hosts;
  for (int h = 0; h < bed.hosts(); ++h) {
    std::vector<std::string> args = {"--nnodes",
                                     std::to_string(bed.hosts()),
                                     "--node-rank",
                                     std::to_string(h),
                                     "--nproc-per-node",
                                     std::to_string(nproc),
                                     "--master-addr",
                                     master == Master::kIpv6   ? bed.ipv6(0)
                                     : master == Master::kName ? bed.name(0)
                                                               : bed.ipv4(0),
                                     "--master-port",
                                     "29500"};
    args.insert(args.end(), program.begin(), program.end());
    hosts.push_back(std::make_unique<GwrunProcess>(args, bed.exec(h)));
  }
  return hosts;
}

std::vector<GwrunResult> run_across(const NetnsBed& bed, int nproc,
                                    const std::vector<std::string>& program,
                                    Master master = Master::kIpv4) {
  auto hosts = start_across(bed, nproc, program, master);
  return finish_all(hosts);
}

// One FIFO per rank, <dir>/go.<rank>, in a fresh directory: a liveness_probe blocks reading its
// own until the test says "go".
class GoFifos {
 public:
  explicit GoFifos(int ranks) : ranks_(ranks) {
    char dir[] = "/tmp/gw_go_XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    dir_ = dir;
    for (int r = 0; r < ranks; ++r) REQUIRE(::mkfifo(path(r).c_str(), 0600) == 0);
  }
  ~GoFifos() {
    for (int r = 0; r < ranks_; ++r) ::unlink(path(r).c_str());
    ::rmdir(dir_.c_str());
  }
  std::string base() const { return dir_ + "/go"; }
  std::string path(int rank) const { return base() + "." + std::to_string(rank); }
  // Opening blocks until the probe opens its end: every probe must be waiting already.
  void go(int rank) const {
    const int fd = ::open(path(rank).c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "go\n", 3) == 3);
    ::close(fd);
  }

 private:
  int ranks_;
  std::string dir_;
};

std::string all_output(const std::vector<GwrunResult>& results) {
  std::string text;
  for (size_t h = 0; h < results.size(); ++h)
    text += "--- host " + std::to_string(h) + " (exit " + std::to_string(results[h].exit_code) +
            ")\n" + results[h].out + results[h].err;
  return text;
}

#define SKIP_WITHOUT_BED() \
  if (const std::string why = NetnsBed::unavailable(); !why.empty()) GW_SKIP(why)

}  // namespace

TEST_CASE("the RPC examples run across three hosts", "[examples][multihost]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(3);
  SharedKey key;
  const auto r = run_across(bed, 1, {GW_RPC_BASICS});
  INFO(all_output(r));
  for (const auto& host : r) CHECK(host.exit_code == 0);
  CHECK(count(r[0].out, "rpc_sync add:        tensor([4., 4.])") == 1);
  CHECK(count(r[0].out, "async_add_chained:   tensor([3., 3.])") == 1);
  CHECK(count(r[0].out, "get_worker_info:     WorkerInfo(name=worker2, id=2)") == 1);
}

TEST_CASE("RPC across hosts over IPv6: the store, the agents and gwrun's --master-addr",
          "[examples][multihost]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(3);
  SharedKey key;
  const auto r = run_across(bed, 1, {GW_RPC_BASICS}, Master::kIpv6);
  INFO(all_output(r));
  for (const auto& host : r) CHECK(host.exit_code == 0);
  CHECK(count(r[0].out, "remote + to_here:    tensor([6., 6.])") == 1);
}

TEST_CASE("RPC across hosts with the master named by its host name", "[examples][multihost]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(3);
  SharedKey key;
  const auto r = run_across(bed, 1, {GW_RPC_BASICS}, Master::kName);
  INFO(all_output(r));
  for (const auto& host : r) CHECK(host.exit_code == 0);
  CHECK(count(r[0].out, "rref.remote():       tensor([4., 4.])") == 1);
}

TEST_CASE("distributed autograd and the parameter server run across hosts",
          "[examples][multihost]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(3);
  SharedKey key;
  {
    const auto r = run_across(bed, 1, {GW_SEED_EXAMPLE});
    INFO(all_output(r));
    for (const auto& host : r) CHECK(host.exit_code == 0);
    CHECK(count(all_output(r), "check passed") == 3);
  }
  {
    const auto r =
        run_across(bed, 1, {GW_PS_EXAMPLE, "--epochs", "1", "--limit", "6400", "--target", "0.6"});
    INFO(all_output(r));
    for (const auto& host : r) CHECK(host.exit_code == 0);
    CHECK(count(r[0].out, "test accuracy") == 1);
  }
}

TEST_CASE("DDP across three hosts trains as on one: same accuracy, identical parameters",
          "[examples][multihost][ddp]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(3);
  SharedKey key;
  const std::vector<std::string> ddp = {GW_DDP_EXAMPLE, "--epochs", "1",  "--limit",
                                        "3600",         "--target", "0.5"};
  const auto r = run_across(bed, 1, ddp);
  INFO(all_output(r));
  for (const auto& host : r) CHECK(host.exit_code == 0);
  CHECK(count(all_output(r), "parameters identical to rank 0's: yes") == 3);
  // The same job, three workers on one host.
  const GwrunResult local = GwrunProcess(
                                [&] {
                                  std::vector<std::string> a = {"--nproc-per-node", "3"};
                                  a.insert(a.end(), ddp.begin(), ddp.end());
                                  return a;
                                }(),
                                bed.exec(0))
                                .finish();
  INFO(local.out << local.err);
  REQUIRE(local.exit_code == 0);
  auto accuracy = [](const std::string& out) {
    const auto at = out.find("epoch 1: test accuracy");
    return at == std::string::npos ? std::string("(none)")
                                   : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(accuracy(r[0].out) == accuracy(local.out));
}

TEST_CASE("gwrun --rdzv-endpoint across hosts: nodes started in any order run the job",
          "[examples][multihost]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(3);
  SharedKey key;
  std::vector<std::unique_ptr<GwrunProcess>> hosts;
  for (int h : {2, 1, 0})  // the hosting node last
    hosts.push_back(std::make_unique<GwrunProcess>(
        std::vector<std::string>{"--nnodes", "3", "--rdzv-endpoint", bed.ipv4(0) + ":29400",
                                 "--nproc-per-node", "1", GW_RPC_BASICS},
        bed.exec(h)));
  const auto r = finish_all(hosts);
  INFO(all_output(r));
  for (const auto& host : r) CHECK(host.exit_code == 0);
  CHECK(count(all_output(r), "get_worker_info:     WorkerInfo(name=worker2, id=2)") == 1);
}

TEST_CASE("gwrun --max-restarts across hosts: a DDP rank killed, every node restarts and resumes",
          "[examples][multihost]") {
  SKIP_WITHOUT_BED();
  NetnsBed bed(2);
  SharedKey key;
  gw::test::TempDir checkpoints("gw_resume");  // every host sees it, as a shared file system
  std::vector<std::unique_ptr<GwrunProcess>> hosts;
  for (int h = 0; h < 2; ++h)
    hosts.push_back(std::make_unique<GwrunProcess>(
        std::vector<std::string>{"--nnodes", "2", "--rdzv-endpoint", bed.ipv4(0) + ":29400",
                                 "--max-restarts", "2", "--nproc-per-node", "1", GW_DDP_EXAMPLE,
                                 "--epochs", "2", "--limit", "3600", "--target", "0.5",
                                 "--checkpoint-every", "10", "--checkpoint-dir", checkpoints.path},
        bed.exec(h)));
  // Rank 0 (on the host that arrived first) reports its checkpoints; rank 1 is on the other.
  const int first = GwrunProcess::wait_for_any_stdout({hosts[0].get(), hosts[1].get()},
                                                      "checkpoint saved: epoch 2, step 20");
  REQUIRE(first >= 0);
  const pid_t victim = hosts[1 - first]->worker_pid(1);
  REQUIRE(victim > 0);
  REQUIRE(::kill(victim, SIGKILL) == 0);
  const auto r = finish_all(hosts);
  const std::string all = all_output(r);
  INFO(all);
  for (const auto& host : r) {
    CHECK(host.exit_code == 0);
    CHECK(count(host.err, "restarting all workers (restart 1 of 2)") == 1);
  }
  // On its host; the other host reports it too, or its own rank's failure that came first.
  CHECK(count(all, "rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9") >= 1);
  CHECK(count(all, "resuming from " + checkpoints.path + " at epoch 2, step ") == 1);
  CHECK(count(all, "parameters identical to rank 0's: yes") == 2);
}

TEST_CASE("a host cut off mid-job: every rank raises within failure_timeout, and gwrun exits",
          "[examples][multihost][liveness]") {
  SKIP_WITHOUT_BED();
  const std::string scenario = GENERATE("rpc", "autograd", "allreduce");
  DYNAMIC_SECTION(scenario) {
    constexpr double kWindow = 2;  // seconds: GW_FAILURE_TIMEOUT for every worker
    gw::test::ScopedEnv window(gw::store::kFailureTimeoutEnv, "2");
    NetnsBed bed(3);
    SharedKey key;
    GoFifos fifos(3);
    auto hosts = start_across(bed, 1, {GW_LIVENESS_PROBE, scenario, fifos.base()});
    for (int h = 0; h < 3; ++h)
      REQUIRE(hosts[h]->wait_for_stdout("rank " + std::to_string(h) + " ready"));
    bed.set_link(1, false);  // host 1's cable pulled: silence, no FIN, no RST
    const auto cut = std::chrono::steady_clock::now();
    for (int r = 0; r < 3; ++r) fifos.go(r);
    const auto r = finish_all(hosts);
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
    INFO(all_output(r));
    INFO("every gwrun exited " << total << " s after the cut");
    const std::regex raised("raised after ([0-9.]+) s: .*(no heartbeat|did not answer|unusable)");
    for (int h = 0; h < 3; ++h) {
      CHECK(r[h].exit_code == 1);  // the worker's failure, passed on by gwrun
      std::smatch m;
      REQUIRE(std::regex_search(r[h].out, m, raised));
      const double s = std::stod(m[1]);
      WARN(scenario << ": rank " << h << " raised " << s << " s after the cut");
      // The RPC timeout is 60 s and the collective timeout 30 minutes: only liveness is this
      // fast. (The bound is loose for busy machines; the README reports measured times.)
      CHECK(s < kWindow + 5);
    }
    CHECK(total < 60);
  }
}

TEST_CASE("a store client whose store host is cut off fails within failure_timeout",
          "[examples][multihost][liveness]") {
  SKIP_WITHOUT_BED();
  gw::test::ScopedEnv window(gw::store::kFailureTimeoutEnv, "2");
  NetnsBed bed(2);
  SharedKey key;
  GoFifos fifos(2);
  auto hosts = start_across(bed, 1, {GW_LIVENESS_PROBE, "store", fifos.base()});
  for (int h = 0; h < 2; ++h)
    REQUIRE(hosts[h]->wait_for_stdout("rank " + std::to_string(h) + " ready"));
  bed.set_link(0, false);  // the store's host: silence, no FIN, no RST
  for (int r = 0; r < 2; ++r) fifos.go(r);
  const auto r = finish_all(hosts);
  INFO(all_output(r));
  CHECK(r[0].exit_code == 0);
  CHECK(r[1].exit_code == 1);
  std::smatch m;
  REQUIRE(std::regex_search(r[1].out, m, std::regex("raised after ([0-9.]+) s")));
  WARN("the store client raised " << m[1] << " s after the cut");
  CHECK(std::stod(m[1]) < 2 + 5);  // its wait was for 10 minutes
}
