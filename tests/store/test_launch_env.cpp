// Who a process is in its job, read from each launcher's variables (store/launch_env.h), and
// which address it listens on (store/net_address.h).
#include <catch2/catch.hpp>

#include <ifaddrs.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "core/error.h"
#include "store/launch_env.h"
#include "store/net_address.h"
#include "store/tcp_store.h"
#include "tests/skip.h"

using namespace gw;
using namespace gw::store;
using Catch::Contains;

namespace {

// Exactly `vars` of the launchers' variables are set while it lives; the rest are unset.
class Env {
 public:
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* name : kAll) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const char* name : kAll) ::unsetenv(name);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr const char* kAll[] = {"RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_RANK",
                                         "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR",
                                         "MASTER_PORT",
                                         "GW_LAUNCHER",
                                         "TORCHELASTIC_RUN_ID",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                                         "PMIX_NAMESPACE",
                                         "OMPI_MCA_ess_base_jobid",
                                         "OMPI_MCA_orte_ess_jobid",
                                         "SLURM_PROCID",
                                         "SLURM_STEP_ID",
                                         "SLURM_NTASKS",
                                         "SLURM_STEP_NUM_TASKS",
                                         "SLURM_LOCALID",
                                         "SLURM_NODEID",
                                         "SLURM_STEP_TASKS_PER_NODE",
                                         "SLURM_JOB_NODELIST",
                                         "SLURM_STEP_NODELIST",
                                         "SLURM_JOB_ID",
                                         kSocketIfnameEnv};
  std::map<std::string, std::string> saved_;
};

const std::map<std::string, std::string> kSlurm = {{"SLURM_PROCID", "3"},
                                                   {"SLURM_STEP_ID", "0"},
                                                   {"SLURM_NTASKS", "4"},
                                                   {"SLURM_LOCALID", "1"},
                                                   {"SLURM_NODEID", "1"},
                                                   {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                                   {"SLURM_JOB_NODELIST", "node[07-08]"},
                                                   {"SLURM_JOB_ID", "1234"}};

std::map<std::string, std::string> with(std::map<std::string, std::string> base,
                                        const std::map<std::string, std::string>& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

}  // namespace

TEST_CASE("no launcher: a job of one process on loopback", "[store][launch]") {
  Env env({});
  const LaunchEnv e = detect_launch_env();
  CHECK(e.launcher == "none");
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.init_method() == "tcp://127.0.0.1:0");
}

TEST_CASE("gwrun, torchrun and a PyTorchJob: RANK and WORLD_SIZE", "[store][launch]") {
  const std::map<std::string, std::string> torch = {{"RANK", "5"},
                                                    {"WORLD_SIZE", "8"},
                                                    {"LOCAL_RANK", "1"},
                                                    {"LOCAL_WORLD_SIZE", "4"},
                                                    {"MASTER_ADDR", "node1"},
                                                    {"MASTER_PORT", "29500"}};
  {
    Env env(with(torch, {{"GW_LAUNCHER", "gwrun"}}));
    const LaunchEnv e = detect_launch_env();
    CHECK(e.launcher == "gwrun");
    CHECK((e.rank == 5 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 4));
    CHECK(e.init_method() == "tcp://node1:29500");
    CHECK(e.describe() == "gwrun: rank 5 of 8 (local 1 of 4), master node1:29500");
  }
  {
    Env env(with(torch, {{"TORCHELASTIC_RUN_ID", "abc"}}));
    CHECK(detect_launch_env().launcher == "torchrun");
  }
  {
    // Kubeflow's PyTorchJob: one process per pod, no LOCAL_* variables.
    Env env(
        {{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "fd00::1"}, {"MASTER_PORT", "23456"}});
    const LaunchEnv e = detect_launch_env();
    CHECK(e.launcher == "env");
    CHECK((e.rank == 2 && e.world_size == 3 && e.local_rank == 0 && e.local_world_size == 1));
    CHECK(e.init_method() == "tcp://[fd00::1]:23456");
  }
  {
    // torchrun started by srun: torchrun's variables win.
    Env env(with(with(torch, kSlurm), {{"TORCHELASTIC_RUN_ID", "abc"}}));
    CHECK(detect_launch_env().launcher == "torchrun");
    CHECK(detect_launch_env().rank == 5);
  }
}

TEST_CASE("Slurm: srun's variables, the master from the node list", "[store][launch]") {
  {
    Env env(kSlurm);
    const LaunchEnv e = detect_launch_env();
    CHECK(e.launcher == "slurm");
    CHECK((e.rank == 3 && e.world_size == 4 && e.local_rank == 1 && e.local_world_size == 2));
    CHECK(e.master_addr == "node07");
    CHECK((e.master_port >= 20000 && e.master_port < 30000));
  }
  {
    // Another task of the same step, on the other node: the same master and port.
    const uint16_t port = [] {
      Env env(kSlurm);
      return detect_launch_env().master_port;
    }();
    Env env(with(kSlurm, {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}}));
    CHECK(detect_launch_env().rank == 0);
    CHECK(detect_launch_env().master_port == port);  // the same on every rank
  }
  {
    Env env(with(kSlurm, {{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "31000"}}));
    CHECK(detect_launch_env().init_method() == "tcp://10.1.2.3:31000");
  }
  {
    // A batch script or an interactive step (newer Slurm sets SLURM_STEP_ID=-5 there) is not
    // one of an srun step's tasks.
    Env env({{"SLURM_PROCID", "0"},
             {"SLURM_STEP_ID", "-5"},
             {"SLURM_NTASKS", "8"},
             {"SLURM_JOB_NODELIST", "node1"},
             {"SLURM_JOB_ID", "7"}});
    CHECK(detect_launch_env().launcher == "none");
  }
  CHECK(first_slurm_host("node[07-09,12],gpu1") == "node07");
  CHECK(first_slurm_host("alpha,beta") == "alpha");
  CHECK(first_slurm_host("rack[2-3]-n[10-11]") == "rack2-n10");
  CHECK_THROWS_WITH(first_slurm_host("node[1-2"), Contains("unclosed"));
}

TEST_CASE("OpenMPI: mpirun's variables; across nodes MASTER_ADDR is needed", "[store][launch]") {
  const std::map<std::string, std::string> mpi = {{"OMPI_COMM_WORLD_RANK", "1"},
                                                  {"OMPI_COMM_WORLD_SIZE", "2"},
                                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                  {"PMIX_NAMESPACE", "prterun-host-1234@1"}};
  {
    Env env(mpi);
    const LaunchEnv e = detect_launch_env();
    CHECK(e.launcher == "openmpi");
    CHECK((e.rank == 1 && e.world_size == 2 && e.local_rank == 1 && e.local_world_size == 2));
    CHECK(e.master_addr == "127.0.0.1");
    CHECK((e.master_port >= 20000 && e.master_port < 30000));
  }
  {
    Env env(with(mpi, {{"OMPI_COMM_WORLD_SIZE", "4"}}));
    CHECK_THROWS_WITH(detect_launch_env(),
                      Contains("MASTER_ADDR") && Contains("OMPI_COMM_WORLD_SIZE=4"));
  }
  {
    Env env(with(mpi, {{"OMPI_COMM_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node1"}}));
    CHECK(detect_launch_env().master_addr == "node1");
  }
}

TEST_CASE("an inconsistent environment is an error naming the variables", "[store][launch]") {
  auto fails = [](const std::map<std::string, std::string>& vars) {
    Env env(vars);
    try {
      detect_launch_env();
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::map<std::string, std::string> ok = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}};
  CHECK_THAT(fails({{"RANK", "0"}}), Contains("RANK is set") && Contains("WORLD_SIZE is not"));
  CHECK_THAT(fails({{"WORLD_SIZE", "2"}}),
             Contains("WORLD_SIZE is set") && Contains("RANK is not"));
  CHECK_THAT(fails(with(ok, {{"RANK", "2"}})), Contains("RANK=2 is outside [0, WORLD_SIZE=2)"));
  CHECK_THAT(fails(with(ok, {{"RANK", "one"}})), Contains("RANK='one' is not an integer"));
  CHECK_THAT(fails(with(ok, {{"MASTER_PORT", "70000"}})), Contains("MASTER_PORT=70000"));
  CHECK_THAT(fails(with(ok, {{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}})),
             Contains("LOCAL_RANK=3"));
  auto no_master = ok;
  no_master.erase("MASTER_ADDR");
  CHECK_THAT(fails(no_master), Contains("MASTER_ADDR is not"));
  CHECK_THAT(fails(with(kSlurm, {{"SLURM_NODEID", "5"}})),
             Contains("SLURM_STEP_TASKS_PER_NODE='2(x2)' lists no node 5"));
}

TEST_CASE("the address to listen on: the route to the master, or the named interface",
          "[store][launch]") {
  Env env({});
  CHECK(resolve_host("127.0.0.1", "test") == "127.0.0.1");
  CHECK(resolve_host("localhost", "test").rfind("127.", 0) == 0);
  CHECK_THROWS_WITH(resolve_host("no-such-host.invalid", "test"),
                    Contains("[test] cannot resolve host 'no-such-host.invalid'"));
  CHECK(reachable_address("127.0.0.1", "test") == "127.0.0.1");  // a job on this host
  CHECK(default_address("test") == "127.0.0.1");
  ::setenv(kSocketIfnameEnv, "lo", 1);
  CHECK(reachable_address("127.0.0.1", "test") == "127.0.0.1");
  CHECK(default_address("test") == "127.0.0.1");
  ::setenv(kSocketIfnameEnv, "no-such-if0", 1);
  CHECK_THROWS_WITH(
      default_address("init_rpc"),
      Contains("[init_rpc] GW_SOCKET_IFNAME='no-such-if0' is not an interface") && Contains("lo"));
  ::unsetenv(kSocketIfnameEnv);
}

// gwrun hands a free port to the rank that will host the store, and holds it until that rank
// listens: chosen below the range the kernel picks bind(0) and outgoing connections from, and
// below the band launchers without MASTER_PORT derive theirs from; held against every other
// plain bind (another job's probe), yet open to the store's listen.
TEST_CASE(
    "a free port for a master: held against other binds, listenable, outside the kernel's "
    "and the derived ports' ranges",
    "[store][launch]") {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (!(range >> low >> high) || low < 11000)
    GW_SKIP("the ephemeral port range leaves no room below it");
  for (int i = 0; i < 5; ++i) {
    const HeldPort held = hold_free_port("127.0.0.1", "test");
    CHECK(held.port() >= 10000);
    CHECK(held.port() < std::min<int>(low, kDerivedPortFirst));
    CHECK(port_in_use("127.0.0.1", held.port()));
    CHECK(hold_free_port("127.0.0.1", "test").port() != held.port());
    TCPStoreOptions o;
    o.port = held.port(), o.is_master = true, o.world_size = 1;
    CHECK(TCPStore("127.0.0.1", o).port() == held.port());
  }
  uint16_t port = 0;
  {
    const HeldPort held = hold_free_port("127.0.0.1", "test");
    port = held.port();
  }
  CHECK_FALSE(port_in_use("127.0.0.1", port));  // free again once dropped
}
