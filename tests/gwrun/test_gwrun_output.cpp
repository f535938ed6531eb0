// gwrun end to end: the workers' environment and how their output is forwarded.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/gwrun/gwrun_process.h"

using gw::test::GwrunResult;
using gw::test::run_gwrun;
using gw::test::split_lines;

namespace {

struct WorkerEnv {
  int world_size, local_rank, local_world_size, group_rank;
  std::string master_addr, master_port;
};

constexpr const char* kPrintEnv =
    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
    "$MASTER_PORT\"";

// Runs kPrintEnv under gwrun and returns each reported RANK's environment; every line must
// carry the prefix of the rank it reports, and no rank may report twice.
std::map<int, WorkerEnv> worker_envs(std::vector<std::string> flags) {
  for (const char* arg : {"sh", "-c", kPrintEnv}) flags.push_back(arg);
  GwrunResult r = run_gwrun(flags);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  std::map<int, WorkerEnv> envs;
  for (const std::string& line : split_lines(r.out)) {
    std::istringstream in(line);
    std::string prefix;
    int rank = -1;
    WorkerEnv env;
    in >> prefix >> rank >> env.world_size >> env.local_rank >> env.local_world_size >>
        env.group_rank >> env.master_addr >> env.master_port;
    REQUIRE(in);
    CHECK(prefix == "[" + std::to_string(rank) + "]");
    CHECK(envs.emplace(rank, env).second);
  }
  return envs;
}

}  // namespace

TEST_CASE("gwrun gives each of N workers its rank and the world", "[gwrun]") {
  std::map<int, WorkerEnv> envs = worker_envs({"--nproc-per-node", "3"});
  REQUIRE(envs.size() == 3);
  std::string port = envs.begin()->second.master_port;
  int port_number = std::stoi(port);
  CHECK(port_number > 0);
  CHECK(port_number < 65536);
  for (int rank = 0; rank < 3; ++rank) {
    REQUIRE(envs.count(rank) == 1);
    const WorkerEnv& env = envs.at(rank);
    CHECK(env.world_size == 3);
    CHECK(env.local_rank == rank);
    CHECK(env.local_world_size == 3);
    CHECK(env.group_rank == 0);
    CHECK(env.master_addr == "127.0.0.1");
    CHECK(env.master_port == port);  // one rendezvous point for all
  }
}

TEST_CASE("gwrun on the second of two nodes starts global ranks N..2N-1", "[gwrun]") {
  std::map<int, WorkerEnv> envs =
      worker_envs({"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1"});
  REQUIRE(envs.size() == 3);
  for (int rank = 3; rank < 6; ++rank) {
    REQUIRE(envs.count(rank) == 1);
    const WorkerEnv& env = envs.at(rank);
    CHECK(env.world_size == 6);
    CHECK(env.local_rank == rank - 3);
    CHECK(env.local_world_size == 3);
    CHECK(env.group_rank == 1);
    CHECK(env.master_port == "29500");  // torchrun's multi-node default
  }
}

TEST_CASE("gwrun accepts --flag=value and torchrun's underscore spelling", "[gwrun]") {
  std::map<int, WorkerEnv> envs = worker_envs({"--nproc_per_node=2", "--nnodes=3", "--node-rank=2",
                                               "--master-addr=10.1.2.3", "--master_port", "1234"});
  REQUIRE(envs.size() == 2);
  for (int rank = 4; rank < 6; ++rank) {
    REQUIRE(envs.count(rank) == 1);
    CHECK(envs.at(rank).world_size == 6);
    CHECK(envs.at(rank).group_rank == 2);
    CHECK(envs.at(rank).master_addr == "10.1.2.3");
    CHECK(envs.at(rank).master_port == "1234");
  }
}

TEST_CASE("gwrun replaces a RANK it inherited instead of adding a second one", "[gwrun]") {
  // `env` prints its environ as is; a shell would hide a duplicate by keeping the last one.
  REQUIRE(::setenv("RANK", "99", 1) == 0);
  GwrunResult r = run_gwrun({"--nproc-per-node", "2", "env"});
  ::unsetenv("RANK");
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> rank_vars;
  for (const std::string& line : split_lines(r.out)) {
    if (line.find("] RANK=") != std::string::npos) rank_vars.push_back(line);
  }
  std::sort(rank_vars.begin(), rank_vars.end());
  CHECK(rank_vars == std::vector<std::string>{"[0] RANK=0", "[1] RANK=1"});
}

TEST_CASE("gwrun passes the program's arguments through untouched", "[gwrun]") {
  GwrunResult r = run_gwrun({"--nproc-per-node", "1", "--", "sh", "-c", "printf '%s|' \"$@\"", "sh",
                             "--nnodes=5", "a b", ""});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "[0] --nnodes=5|a b||\n");
}

TEST_CASE("gwrun prefixes stdout and stderr lines, unterminated last lines too", "[gwrun]") {
  GwrunResult r = run_gwrun(
      {"--nproc-per-node", "2", "sh", "-c", "printf 'out1\\nout2'; printf 'err1\\n\\nerr2' >&2"});
  REQUIRE(r.exit_code == 0);
  for (const std::string* text : {&r.out, &r.err}) {
    REQUIRE(!text->empty());
    CHECK(text->back() == '\n');
  }
  std::vector<std::string> out = split_lines(r.out), err = split_lines(r.err);
  CHECK(std::multiset<std::string>(out.begin(), out.end()) ==
        std::multiset<std::string>{"[0] out1", "[0] out2", "[1] out1", "[1] out2"});
  CHECK(std::multiset<std::string>(err.begin(), err.end()) ==
        std::multiset<std::string>{"[0] err1", "[0] ", "[0] err2", "[1] err1", "[1] ", "[1] err2"});
  for (const char* rank : {"[0] ", "[1] "}) {  // each worker's lines keep their order
    CHECK(r.out.find(std::string(rank) + "out1") < r.out.find(std::string(rank) + "out2"));
    CHECK(r.err.find(std::string(rank) + "err1") < r.err.find(std::string(rank) + "err2"));
  }
}

TEST_CASE("gwrun never splices one worker's line into another's", "[gwrun]") {
  constexpr int kWorkers = 4, kLines = 2000;
  const std::string pad(150, 'x');
  const std::string long_line(20000, 'y');  // longer than a pipe write is atomic for
  std::string script = "i=0; while [ $i -lt " + std::to_string(kLines) +
                       " ]; do echo \"r$RANK $i " + pad + "\"; i=$((i+1)); done; printf '" +
                       long_line + "\\n'";
  GwrunResult r = run_gwrun({"--nproc-per-node", std::to_string(kWorkers), "sh", "-c", script});
  REQUIRE(r.exit_code == 0);
  std::vector<int> next_index(kWorkers, 0);
  std::vector<int> long_lines(kWorkers, 0);
  for (const std::string& line : split_lines(r.out)) {
    REQUIRE(line.size() > 4);
    int rank = line[1] - '0';
    REQUIRE(line.substr(0, 4) == "[" + std::to_string(rank) + "] ");
    REQUIRE(rank < kWorkers);
    if (line.substr(4) == long_line) {
      ++long_lines[rank];
      continue;
    }
    std::string expected =
        "r" + std::to_string(rank) + " " + std::to_string(next_index[rank]++) + " " + pad;
    REQUIRE(line.substr(4) == expected);
  }
  CHECK(next_index == std::vector<int>(kWorkers, kLines));
  CHECK(long_lines == std::vector<int>(kWorkers, 1));
  CHECK(r.err.empty());
}

TEST_CASE("gwrun hands its workers one private job key and removes it after the job", "[gwrun]") {
  REQUIRE(::unsetenv("GW_JOB_KEY_FILE") == 0);
  GwrunResult r =
      run_gwrun({"--nproc-per-node", "2", "sh", "-c",
                 "f=$GW_JOB_KEY_FILE; echo \"$f $(stat -c %a \"$f\") "
                 "$(stat -c %a \"$(dirname \"$f\")\") $(tr -d '\\n' < \"$f\" | wc -c)\""});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  std::set<std::string> paths;
  for (const std::string& line : split_lines(r.out)) {
    std::istringstream in(line);
    std::string prefix, path, file_mode, dir_mode;
    int hex_digits = 0;
    in >> prefix >> path >> file_mode >> dir_mode >> hex_digits;
    REQUIRE(in);
    CHECK(file_mode == "600");
    CHECK(dir_mode == "700");
    CHECK(hex_digits == 64);
    paths.insert(path);
  }
  REQUIRE(paths.size() == 1);  // one key for the whole job
  CHECK_FALSE(std::filesystem::exists(*paths.begin()));
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(*paths.begin()).parent_path()));
}

TEST_CASE("gwrun passes a job key file it was given on, and leaves it", "[gwrun]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("gwrun-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto key = dir / "job.key";
  std::ofstream(key) << std::string(64, 'c') << "\n";
  std::filesystem::permissions(
      key, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  REQUIRE(::setenv("GW_JOB_KEY_FILE", key.c_str(), 1) == 0);
  GwrunResult r = run_gwrun({"--nproc-per-node", "1", "sh", "-c", "echo \"$GW_JOB_KEY_FILE\""});
  ::unsetenv("GW_JOB_KEY_FILE");
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "[0] " + key.string() + "\n");
  CHECK(std::filesystem::exists(key));
  // A key file others may read is refused before any worker starts.
  std::filesystem::permissions(key, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  REQUIRE(::setenv("GW_JOB_KEY_FILE", key.c_str(), 1) == 0);
  GwrunResult bad = run_gwrun({"--nproc-per-node", "1", "sh", "-c", "echo started"});
  ::unsetenv("GW_JOB_KEY_FILE");
  CHECK(bad.exit_code != 0);
  CHECK(bad.out.empty());
  CHECK_THAT(bad.err, Catch::Contains("chmod 600"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("nodes started in any order meet at --rdzv-endpoint and receive their node ranks",
          "[gwrun]") {
  const gw::test::ReservedPort port;
  const std::string endpoint = port.endpoint();
  std::vector<std::unique_ptr<gw::test::GwrunProcess>> nodes;
  for (int n = 0; n < 3; ++n)
    nodes.push_back(std::make_unique<gw::test::GwrunProcess>(
        std::vector<std::string>{"--nnodes", "3", "--rdzv-endpoint", endpoint, "--nproc-per-node",
                                 "2", "sh", "-c", kPrintEnv}));
  std::set<int> ranks, group_ranks;
  std::set<std::string> masters;
  for (auto& node : nodes) {
    const GwrunResult r = node->finish();
    INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    REQUIRE(r.exit_code == 0);
    for (const std::string& line : split_lines(r.out)) {
      std::istringstream in(line.substr(line.find(']') + 2));
      int rank = -1;
      WorkerEnv env{};
      in >> rank >> env.world_size >> env.local_rank >> env.local_world_size >> env.group_rank >>
          env.master_addr >> env.master_port;
      CHECK(env.world_size == 6);
      CHECK(rank == env.group_rank * 2 + env.local_rank);
      ranks.insert(rank);
      group_ranks.insert(env.group_rank);
      masters.insert(env.master_addr + ":" + env.master_port);
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3, 4, 5});
  CHECK(group_ranks == std::set<int>{0, 1, 2});
  CHECK(masters.size() == 1);  // every worker was told the same master
}

TEST_CASE("a node that never arrives fails the rendezvous after --rdzv-timeout", "[gwrun]") {
  const gw::test::ReservedPort port;
  const std::string endpoint = port.endpoint();
  const GwrunResult r = run_gwrun({"--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-timeout",
                                   "1", "--nproc-per-node", "1", "sh", "-c", "echo ran"});
  INFO("stderr:\n" << r.err);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("ran") == std::string::npos);  // no worker started
  CHECK(r.err.find("rendezvous at " + endpoint + ": 1 of 2 nodes arrived within 1 s") !=
        std::string::npos);
}
