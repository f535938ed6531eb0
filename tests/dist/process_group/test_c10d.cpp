// dist/process_group/c10d.h over real Gloo, ranks as threads: all_to_all_single with even and
// uneven splits, batch_isend_irecv around a ring, byte buffers broadcast and gathered, and the
// default group's rank and size.
#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "core/ops.h"
#include "dist/process_group/c10d.h"
#include "dist/process_group/init_process_group.h"
#include "store/hash_store.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using namespace std::chrono_literals;

namespace {
// Row k of the chunk rank `src` sends to rank `dst`: src * 100 + dst * 10 + k, + 0.5 in column 1.
Tensor chunk(int src, int dst, int64_t rows) {
  std::vector<double> v;
  for (int64_t k = 0; k < rows; ++k)
    for (int c = 0; c < 2; ++c)
      v.push_back(src * 100 + dst * 10 + static_cast<double>(k) + c * 0.5);
  return from_vector<double>(v).reshape({rows, 2});
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("all_to_all_single with even and uneven splits", "[c10d]") {
  run_ranks(
      3,
      [](dist::ProcessGroupGloo& pg, Checks& c) {
        const int me = pg.rank(), n = pg.size();
        // Even: two rows for every rank.
        std::vector<Tensor> mine, expected;
        for (int r = 0; r < n; ++r) {
          mine.push_back(chunk(me, r, 2));
          expected.push_back(chunk(r, me, 2));
        }
        Tensor out = zeros({2 * n, 2}, kFloat64);
        dist::all_to_all_single(pg, out, cat(mine, 0));
        EXPECT(c, allclose(out, cat(expected, 0)));
        // Uneven: rank s sends s + d rows to rank d (none from rank 0 to itself).
        std::vector<int64_t> in_splits, out_splits;
        mine.clear(), expected.clear();
        for (int r = 0; r < n; ++r) {
          in_splits.push_back(me + r);
          out_splits.push_back(r + me);
          mine.push_back(chunk(me, r, me + r));
          expected.push_back(chunk(r, me, r + me));
        }
        Tensor uneven = zeros({3 * me + 3, 2}, kFloat64);
        dist::all_to_all_single(pg, uneven, cat(mine, 0), out_splits, in_splits);
        EXPECT(c, allclose(uneven, cat(expected, 0)));
        // A rank with nothing to send or receive (rows of the same shape, none of them).
        Tensor none = zeros({0, 2}, kFloat64);
        Tensor some = zeros({me == 0 ? 0 : 2, 2}, kFloat64);
        const std::vector<int64_t> to =
            me == 0 ? std::vector<int64_t>{0, 0, 0} : std::vector<int64_t>{0, 1, 1};
        dist::all_to_all_single(
            pg, some,
            me == 0 ? none : cat(std::vector<Tensor>{chunk(me, 1, 1), chunk(me, 2, 1)}, 0), to, to);
        if (me > 0)
          EXPECT(c, allclose(some, cat(std::vector<Tensor>{chunk(1, me, 1), chunk(2, me, 1)}, 0)));
        // Sizes that do not add up on one rank: every rank raises, none is left in a collective.
        const std::vector<int64_t> bad = me == 1 ? std::vector<int64_t>{1, 1, 100} : in_splits;
        EXPECT_THROWS(c, InvalidArgumentError,
                      dist::all_to_all_single(pg, uneven, cat(mine, 0), out_splits, bad),
                      me == 1 ? "rank 1: input split sizes [1, 1, 100] must be 3 sizes"
                              : "rank 1's arguments are wrong");
        // A receiver that expects other than what is sent: named on every rank.
        Tensor six = zeros({6, 2}, kFloat64);
        const std::vector<int64_t> expects =
            me == 2 ? std::vector<int64_t>{1, 3, 2} : std::vector<int64_t>{};
        EXPECT_THROWS(c, InvalidArgumentError, dist::all_to_all_single(pg, six, six, expects),
                      "rank 0 sends 2 rows to rank 2, which expects 1");
        // Still in step after the refusals.
        dist::all_to_all_single(
            pg, out,
            cat(std::vector<Tensor>{chunk(me, 0, 2), chunk(me, 1, 2), chunk(me, 2, 2)}, 0));
        EXPECT(c,
               allclose(
                   out,
                   cat(std::vector<Tensor>{chunk(0, me, 2), chunk(1, me, 2), chunk(2, me, 2)}, 0)));
      },
      {.timeout = 20s});
}

TEST_CASE("batch_isend_irecv: a ring of sends and receives started together", "[c10d]") {
  run_ranks(3,
            [](dist::ProcessGroupGloo& pg, Checks& c) {
              const int me = pg.rank(), n = pg.size();
              Tensor out = full({4}, static_cast<double>(me), kFloat64);
              Tensor in = zeros({4}, kFloat64), in_tagged = zeros({4}, kFloat64);
              // Every rank sends first: with blocking sends this ring would wait forever.
              auto works =
                  dist::batch_isend_irecv(pg, {{dist::P2POp::kSend, out, (me + 1) % n},
                                               {dist::P2POp::kSend, out * 2.0, (me + n - 1) % n, 5},
                                               {dist::P2POp::kRecv, in, (me + n - 1) % n},
                                               {dist::P2POp::kRecv, in_tagged, (me + 1) % n, 5}});
              EXPECT(c, works.size() == 4u);
              for (auto& w : works) w->wait();
              EXPECT(c, allclose(in, full({4}, static_cast<double>((me + n - 1) % n), kFloat64)));
              EXPECT(c, allclose(in_tagged, full({4}, 2.0 * ((me + 1) % n), kFloat64)));
              // Checked before anything starts: nothing half begun for a peer to wait on.
              EXPECT_THROWS(c, InvalidArgumentError,
                            dist::batch_isend_irecv(pg, {{dist::P2POp::kSend, out, (me + 1) % n},
                                                         {dist::P2POp::kRecv, in, me}}),
                            "operation 1", "got peer " + std::to_string(me));
            },
            {.timeout = 20s});
}

TEST_CASE(
    "send and recv complete however they are waited for: at once, by polling, on a thread of "
    "their own, never (the Work dropped), or after their group is gone",
    "[c10d]") {
  auto store = std::make_shared<gw::store::HashStore>();
  Checks c;
  auto sender = std::async(std::launch::async, [&] {
    auto pg =
        std::make_shared<dist::ProcessGroupGloo>(store, 0, 2, dist::GlooOptions{.timeout = 20s});
    for (int i = 0; i < 4; ++i) pg->send(full({3}, static_cast<double>(i), kFloat64), 1, i);
    // Waited on a thread of its own, then after the group went.
    auto later = pg->send(full({3}, 4.0, kFloat64), 1, 4);
    later->wait(20s);
    auto after = pg->send(full({3}, 5.0, kFloat64), 1, 5);
    pg->barrier()->wait();  // the receiver has everything
    pg.reset();
    after->wait(20s);
    EXPECT(c, after->is_success());
  });
  std::vector<Tensor> got;
  for (int i = 0; i < 6; ++i) got.push_back(zeros({3}, kFloat64));
  {
    dist::ProcessGroupGloo pg(store, 1, 2, dist::GlooOptions{.timeout = 20s});
    pg.recv(got[0], 0, 0)->wait();        // at once
    auto polled = pg.recv(got[1], 0, 1);  // by polling, bounded
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (!polled->is_completed() && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    EXPECT(c, polled->is_success());
    pg.recv(got[2], 0, 2)->wait(20s);        // on a thread of its own
    auto dropped = pg.recv(got[3], 0, 3);    // dropped: still lands
    dropped.reset();
    for (int i = 4; i < 6; ++i) pg.recv(got[static_cast<size_t>(i)], 0, i)->wait();
    pg.barrier()->wait();
  }  // the group waits for the dropped receive before it goes
  sender.get();
  for (int i = 0; i < 6; ++i)
    EXPECT(c, allclose(got[static_cast<size_t>(i)], full({3}, static_cast<double>(i), kFloat64)));
  gw::dist::testing::require_passed(c);
}

TEST_CASE("byte buffers broadcast and gathered, of any length", "[c10d]") {
  run_ranks(3,
            [](dist::ProcessGroupGloo& pg, Checks& c) {
              const int me = pg.rank();
              const auto from_1 = dist::broadcast_bytes(
                  pg, me == 1 ? bytes("rank 1's plan: 7 bytes") : bytes("x"), 1);
              EXPECT(c, from_1 == bytes("rank 1's plan: 7 bytes"));
              EXPECT(c, dist::broadcast_bytes(pg, {}, 0).empty());
              // Lengths 0, 6 and 11: none a multiple of the words they travel in.
              const std::vector<std::string> names{"", "worker", "worker-two!"};
              const auto all = dist::all_gather_bytes(pg, bytes(names[static_cast<size_t>(me)]));
              EXPECT(c, all.size() == 3u);
              for (size_t r = 0; r < all.size() && r < names.size(); ++r)
                EXPECT(c, all[r] == bytes(names[r]));
              EXPECT_THROWS(c, InvalidArgumentError, dist::broadcast_bytes(pg, {}, 3),
                            "[broadcast_bytes] root 3");
            },
            {.timeout = 20s});
}

TEST_CASE("get_rank and get_world_size of the default group", "[c10d]") {
  REQUIRE_FALSE(dist::is_initialized());
  CHECK_THROWS_AS(dist::get_rank(), StateError);
  CHECK_THROWS_AS(dist::get_world_size(), StateError);
  dist::init_process_group("gloo", std::make_shared<gw::store::HashStore>(), 0, 1);
  CHECK(dist::get_rank() == 0);
  CHECK(dist::get_world_size() == 1);
  dist::destroy_process_group();
}
