// One rank of the MPI process-group tests (test_mpi.cpp), started by `mpirun -np N`.
//   mpi_probe collectives|timeout|die|exit
// collectives: every collective (collective_checks.h) on init_process_group("mpi"), 16-bit
//   sums, subgroups as communicators, argument errors, Work::wait(timeout); each rank prints
//   "rank R: C checks, F failed" and its failures, and exits 1 on any;
// timeout: rank 0's allreduce with a 1 s timeout, which rank 1 never joins (it waits in a
//   receive nobody sends, itself bounded by 60 s): the watchdog must abort the job;
// die: rank 1 exits with code 3 after a first barrier while rank 0 waits in an allreduce;
// exit: a program that asked is_initialized() first (so the default group outlives main's
//   exit handlers' registration), leaves an allreduce unwaited and returns from main: the
//   collective must finish and MPI be finalized after it, exit code 0.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/ops.h"
#include "dist/process_group/init_process_group.h"
#include "tests/dist/process_group/collective_checks.h"

using namespace gw;
using namespace std::chrono_literals;

namespace {

// Waits, bounded, for `work` that nobody runs inline or asked to start: the group's own thread
// must start it. (is_completed() would ask it to start; is_success() and exception() do not.)
bool completes_unasked(const dist::WorkPtr& work) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  auto done = [&] { return work->is_success() || work->exception() != nullptr; };
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  return done();
}

// Collectives that are not waited for at once: several in flight waited in reverse order,
// chained on their futures, and never waited for (on a fresh group, whose thread sleeps).
void check_async(dist::ProcessGroup& pg, dist::testing::Checks& checks) {
  const int r = pg.rank(), world = pg.size();
  const double sum = world * (world + 1) / 2.0;
  Tensor a = ones({4}) * static_cast<double>(r + 1), b = full({3}, r == 0 ? 5.0 : 0.0),
         c = ones({2}) * static_cast<double>(r + 1);
  dist::WorkPtr wa = pg.allreduce(a), wb = pg.broadcast(b), wc = pg.allreduce(c);
  wc->wait();
  wb->wait();
  wa->wait();
  EXPECT(checks,
         allclose(a, full({4}, sum)) && allclose(b, full({3}, 5.0)) && allclose(c, full({2}, sum)));

  Tensor d = ones({5}) * static_cast<double>(r + 1);
  Future<double> total = pg.allreduce(d)->future().then([d](Future<void>& done) {
    done.wait();
    return d.sum().item<double>();
  });
  EXPECT(checks, total.wait() == 5 * sum);

  auto fresh = dist::new_group([&] {
    std::vector<int> all(static_cast<size_t>(world));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }());
  Tensor e = ones({6}) * static_cast<double>(r + 1);
  dist::WorkPtr unasked = fresh->allreduce(e);
  EXPECT(checks, completes_unasked(unasked));
  EXPECT(checks, allclose(e, full({6}, sum)));
  Tensor f = ones({6}) * static_cast<double>(r + 1);
  EXPECT(checks, completes_unasked(pg.allreduce(f)));  // on an awake group thread
  EXPECT(checks, allclose(f, full({6}, sum)));

  // One queued behind a collective that runs inline for about as long as the group's thread
  // stays awake without new collectives (20 ms; the other ranks wait in MPI for rank 1
  // meanwhile): the thread must not go to sleep while it waits to be claimed.
  for (int delay_ms = 14; delay_ms <= 26; ++delay_ms) {
    Tensor g = ones({3}) * static_cast<double>(r + 1), h = ones({3}) * static_cast<double>(r + 1);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    dist::WorkPtr wg = pg.allreduce(g), wh = pg.allreduce(h);
    wg->wait();
    EXPECT(checks, completes_unasked(wh));
    EXPECT(checks, allclose(h, full({3}, sum)));
  }
}

void check_mpi_specifics(dist::ProcessGroup& pg, dist::testing::Checks& checks) {
  const int r = pg.rank(), world = pg.size();
  // 16-bit floats travel as such and are summed.
  for (DType dtype : {kFloat16, kBFloat16}) {
    Tensor h = (ones({6}) * static_cast<double>(r + 1)).to(dtype);
    pg.allreduce(h)->wait();
    EXPECT(checks, allclose(h.to(kFloat64), full({6}, world * (world + 1) / 2.0)));
  }
  EXPECT_THROWS(
      checks, InvalidArgumentError,
      {
        Tensor h = ones({2}).to(kFloat16);
        pg.allreduce(h, {.op = dist::ReduceOp::MAX});
      },
      "[allreduce] float16 tensors are reduced with SUM only, got MAX");
  EXPECT_THROWS(
      checks, InvalidArgumentError,
      {
        Tensor b = ones({2}).to(kBool);
        pg.allreduce(b);
      },
      "[allreduce] bool tensors cannot be reduced");
  EXPECT_THROWS(
      checks, InvalidArgumentError,
      {
        Tensor t = ones({2});
        pg.send(t, r, 0);
      },
      "send");
  // Bool tensors still move.
  Tensor flags = full({3}, r == 0 ? 1.0 : 0.0).to(kBool);
  pg.broadcast(flags)->wait();
  EXPECT(checks, flags.to(kFloat64).sum().item<double>() == 3.0);

  // A bounded wait gives up with TimeoutError and leaves the receive running: the message
  // sent after the barrier completes it.
  if (world >= 2) {
    Tensor got = zeros({4});
    dist::WorkPtr pending;
    if (r == 1) {
      pending = pg.recv(got, 0, 11);
      EXPECT_THROWS(checks, TimeoutError, pending->wait(50ms), "[recv] not completed within 50 ms");
    }
    pg.barrier()->wait();
    if (r == 0) pg.send(full({4}, 7.0), 1, 11)->wait();
    if (r == 1) {
      pending->wait();
      EXPECT(checks, allclose(got, full({4}, 7.0)));
    }
    // A message shorter than the receive's tensor is named.
    Tensor longer = zeros({8});
    if (r == 0) pg.send(ones({3}), 1, 12)->wait();
    if (r == 1)
      EXPECT_THROWS(checks, InvalidArgumentError, pg.recv(longer, 0, 12)->wait(),
                    "expected 8 elements from rank 0 with tag 12, got 3");
    // A receive past its own timeout is cancelled: TimeoutError, and the job goes on.
    if (r == 1)
      EXPECT_THROWS(checks, TimeoutError, pg.recv(longer, 0, 13, {.timeout = 100ms})->wait(),
                    "[recv] rank 1 of", "timed out after 100 ms");
    pg.barrier()->wait();
  }

  check_async(pg, checks);

  // Subgroups are communicators: every rank calls new_group, the others get nullptr.
  auto ends = dist::new_group({0, world - 1});
  EXPECT(checks, (ends != nullptr) == (r == 0 || r == world - 1));
  if (ends) {
    EXPECT(checks, ends->backend() == "mpi");
    Tensor u = ones({3}) * static_cast<double>(r + 1);
    ends->allreduce(u)->wait();
    const double want = world == 1 ? 1.0 : 1.0 + world;
    EXPECT(checks, allclose(u, full({3}, want)));
    dist::testing::check_every_collective(*ends, checks);
  }
  auto mine = dist::new_group({0});  // rank 0 alone
  EXPECT(checks, (mine != nullptr) == (r == 0));
  if (mine) {
    Tensor solo = ones({2});
    mine->allreduce(solo)->wait();
    EXPECT(checks, allclose(solo, ones({2})));
  }
  pg.barrier()->wait();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario != "collectives" && scenario != "timeout" && scenario != "die" &&
      scenario != "exit") {
    std::cerr << "usage: mpi_probe collectives|timeout|die|exit\n";
    return 2;
  }
  int rank = -1;
  try {
    if (scenario == "collectives") {
      // A rank and world size that contradict MPI's are refused, naming both.
      try {
        dist::init_process_group("mpi", "env://", 7, 9);
        std::cerr << "init_process_group with a wrong rank did not throw\n";
        return 1;
      } catch (const InvalidArgumentError& e) {
        if (std::string(e.what()).find("rank 7 of 9 was given, but MPI says") ==
            std::string::npos) {
          std::cerr << "unexpected error: " << e.what() << "\n";
          return 1;
        }
      }
    }
    if (scenario == "exit" && dist::is_initialized()) return 1;
    auto pg = dist::init_process_group("mpi");
    rank = pg->rank();
    if (scenario == "exit") {
      static Tensor left = ones({1 << 16});  // outlives main, as the group does
      pg->allreduce(left);
      std::cout << "rank " << rank << ": returning with an allreduce in flight\n";
      return 0;
    }
    if (scenario == "timeout") {
      if (rank == 1) {
        Tensor never = zeros({1});
        pg->recv(never, 0, 99, {.timeout = 60s})->wait();  // ended by the abort
      }
      Tensor t = ones({4});
      pg->allreduce(t, {.timeout = 1s})->wait();
      std::cerr << "rank " << rank << ": the allreduce completed\n";
      return 1;
    }
    if (scenario == "die") {
      pg->barrier()->wait();
      if (rank == 1) std::_Exit(3);
      Tensor t = ones({4});
      pg->allreduce(t)->wait();  // ended by mpirun
      std::cerr << "rank " << rank << ": the allreduce completed\n";
      return 1;
    }
    dist::testing::Checks checks;
    EXPECT(checks, pg->backend() == "mpi");
    dist::testing::check_every_collective(*pg, checks);
    check_mpi_specifics(*pg, checks);
    std::cout << "rank " << rank << ": " << checks.count << " checks, " << checks.failures.size()
              << " failed\n";
    for (const auto& f : checks.failures) std::cout << "rank " << rank << ": " << f << "\n";
    dist::destroy_process_group();
    return checks.failures.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
}
