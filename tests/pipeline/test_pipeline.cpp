// Pipeline parallelism: schedules as data (complete, deadlock-free, activations held), and a
// GPT cut into 2 and 4 stages on ranks that are threads over real Gloo, whose float64 gradients
// equal the whole model's on the whole batch for every schedule and micro-batch count; stages
// that cannot take what they are given, and ranks that run different schedules, fail on every
// rank before any step; a weight tied across two stages of one rank trains as in one piece.
// Pipelines with data parallelism: test_pipeline_2d.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <latch>
#include <random>
#include <thread>

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "dist/process_group/init_process_group.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "pipeline/schedule.h"
#include "store/tcp_store.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/mpirun.h"
#include "tests/pipeline/jittery.h"
#include "tests/pipeline/pipeline_models.h"
#include "tests/process_util.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using gw::pipeline::ActionType;
using gw::pipeline::Plan;
using namespace pipeline_test;

namespace {

// The most micro-batches rank r holds at once between their forward and their backward (or I:
// the activations), between their I and their W (what the weights' gradients need), or between
// their forward and their backward or W (the first stage's, whose I frees nothing).
enum class Held { activations, until_w, forward_to_w };
int most_in_flight(const Plan& plan, size_t r, Held what = Held::activations) {
  int held = 0, most = 0;
  for (const auto& a : plan[r]) {
    const bool starts =
        what == Held::until_w ? a.type == ActionType::BackwardInput : a.type == ActionType::Forward;
    const bool ends = what == Held::activations
                          ? a.type == ActionType::Backward || a.type == ActionType::BackwardInput
                          : a.type == ActionType::Backward || a.type == ActionType::BackwardWeight;
    held += starts - ends;
    most = std::max(most, held);
  }
  return most;
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

}  // namespace

TEST_CASE("every schedule's plans are complete and deadlock-free; what each stage holds",
          "[pipeline]") {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 5, 8, 9}) {
      INFO(p << " stages, " << m << " micro-batches");
      const Plan g = pipeline::gpipe(p, m), f = pipeline::one_f_one_b(p, m);
      CHECK_NOTHROW(pipeline::check_plan(g, p, m));
      CHECK_NOTHROW(pipeline::check_plan(f, p, m));
      for (size_t s = 0; s < static_cast<size_t>(p); ++s) {
        CHECK(most_in_flight(g, s) == m);
        CHECK(most_in_flight(f, s) == std::min(m, p - static_cast<int>(s)));
      }
      for (int pending : {0, 1, 2}) {
        INFO("zero bubble, " << pending << " pending W at most (0: as many as stages)");
        const Plan z = pipeline::zero_bubble(p, m, pending);
        CHECK_NOTHROW(pipeline::check_plan(z, p, m));
        const int w = pending == 0 ? p : pending;
        CHECK(most_in_flight(z, 0, Held::forward_to_w) == std::min(m, p));
        for (size_t s = 1; s < static_cast<size_t>(p); ++s)
          CHECK(most_in_flight(z, s) == std::min(m, p - static_cast<int>(s)));
        for (size_t s = 0; s < static_cast<size_t>(p); ++s)
          CHECK(most_in_flight(z, s, Held::until_w) <= std::min(m, w));
      }
      for (int v : {2, 3}) {
        if (m % p != 0) {
          CHECK_THROWS_WITH(pipeline::interleaved_one_f_one_b(p, v, m),
                            Catch::Contains("not a multiple of"));
          continue;
        }
        const Plan i = pipeline::interleaved_one_f_one_b(p, v, m);
        CHECK(pipeline::stages_of(i) == p * v);
        CHECK_NOTHROW(pipeline::check_plan(i, p * v, m));
      }
    }
  CHECK(pipeline::to_string(pipeline::one_f_one_b(2, 3)) ==
        "stage 0: F0 F1 B0 F2 B1 B2\nstage 1: F0 B0 F1 B1 F2 B2\n");
  CHECK(pipeline::to_string(pipeline::zero_bubble(2, 2)) ==
        "stage 0: F0 F1 I0 W0 I1 W1\nstage 1: F0 I0 F1 I1 W0 W1\n");
  CHECK(pipeline::to_string(pipeline::interleaved_one_f_one_b(2, 2, 2)) ==
        "rank 0: F0@0 F1@0 F0@2 F1@2 B0@2 B1@2 B0@0 B1@0\n"
        "rank 1: F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 B0@1 B1@1\n");
  CHECK(pipeline::make_plan("gpipe", 2, 2) == pipeline::gpipe(2, 2));
  CHECK_THROWS_WITH(pipeline::make_plan("zb-v", 2, 2),
                    Catch::Contains("gpipe, 1f1b, interleaved or zb"));
}

TEST_CASE("a plan that would deadlock or skips a micro-batch is refused, naming why",
          "[pipeline]") {
  using A = pipeline::Action;
  constexpr auto F = ActionType::Forward;
  constexpr auto B = ActionType::Backward;
  // Stage 0 waits for B0 from stage 1, which waits for F1 from stage 0.
  const Plan crossed{{A{F, 0, 0}, A{B, 0, 0}, A{F, 1, 0}, A{B, 1, 0}},
                     {A{F, 1, 1}, A{F, 0, 1}, A{B, 0, 1}, A{B, 1, 1}}};
  CHECK_THROWS_WITH(pipeline::check_plan(crossed, 2, 2),
                    Catch::Contains("deadlocks") && Catch::Contains("stage 0 waits in B0") &&
                        Catch::Contains("stage 1 waits in F1"));
  const Plan missing{{A{F, 0, 0}, A{B, 0, 0}}, {A{F, 0, 1}}};
  CHECK_THROWS_WITH(
      pipeline::check_plan(missing, 2, 1),
      Catch::Contains("stage 1 runs micro-batch 0's forward 1 times and its backward 0"));
  const Plan early{{A{B, 0, 0}, A{F, 0, 0}}};
  CHECK_THROWS_WITH(pipeline::check_plan(early, 1, 1), Catch::Contains("B0@0 before its forward"));
  const Plan w_first{
      {A{F, 0, 0}, A{ActionType::BackwardWeight, 0, 0}, A{ActionType::BackwardInput, 0, 0}}};
  CHECK_THROWS_WITH(pipeline::check_plan(w_first, 1, 1), Catch::Contains("W0@0 before its I"));
  const Plan elsewhere{{A{F, 0, 1}, A{B, 0, 1}}, {A{F, 0, 0}, A{B, 0, 0}}};
  CHECK_THROWS_WITH(pipeline::check_plan(elsewhere, 2, 1), Catch::Contains("not its own"));
}

TEST_CASE(
    "a GPT cut into stages on 2 and 4 ranks: float64 gradients equal the whole model's, for "
    "every schedule and micro-batch count",
    "[pipeline]") {
  for (int p : {2, 4})
    for (const std::string name : {"gpipe", "1f1b", "interleaved", "zb"}) {
      const bool interleaved = name == "interleaved";
      const int per_rank = interleaved ? 2 : 1, stages = p * per_rank;
      // Interleaving needs whole groups of p micro-batches; 2p + 1 is refused (below).
      const std::vector<int> counts =
          interleaved ? std::vector<int>{p, 2 * p} : std::vector<int>{1, p, 2 * p + 1};
      for (int m : counts) {
        INFO(p << " ranks, " << name << ", " << m << " micro-batches");
        run_ranks(p, [&](dist::ProcessGroupGloo& pg, Checks& c) {
          const int r = pg.rank();
          auto model = gpt();
          std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
          for (int s = r; s < stages; s += p)
            mine.push_back(std::make_shared<pipeline::PipelineStage>(stage_of(*model, s, stages), s,
                                                                     stages, borrow(pg)));
          pipeline::Schedule schedule(mine, pipeline::make_plan(name, p, m), loss_fn);
          auto [x, y] = batch(2 * m);
          const bool first = r == 0, last = r == (stages - 1) % p;
          std::vector<double> losses;
          for (int step = 0; step < 2; ++step) {  // the second reuses the buffers
            model->zero_grad();
            losses.clear();
            schedule.step(first ? x : Tensor(), last ? y : Tensor(), &losses);
          }
          auto reference = gpt();
          const Tensor whole = reference->loss(x, y);
          whole.backward();
          if (last) {
            double mean = 0;
            for (double l : losses) mean += l / m;
            c.expect(static_cast<int>(losses.size()) == m &&
                         std::abs(mean - whole.item<double>()) < 1e-12,
                     "the micro-batches' mean loss is the whole batch's");
          }
          std::vector<Tensor> held;
          for (const auto& st : mine)
            for (const Tensor& t : st->module().parameters()) held.push_back(t);
          const auto params = model->named_parameters(), wants = reference->named_parameters();
          int compared = 0;
          for (size_t i = 0; i < params.size(); ++i) {
            const Tensor& p_i = params[i].second;
            const bool here =
                std::any_of(held.begin(), held.end(), [&](const Tensor& t) { return t.same(p_i); });
            if (!here) {
              c.expect(!p_i.grad().defined(), params[i].first + ": no gradient off this rank");
              continue;
            }
            ++compared;
            c.expect(
                p_i.grad().defined() && allclose(p_i.grad(), wants[i].second.grad(), 1e-12, 1e-14),
                params[i].first + "'s gradient");
          }
          c.expect(compared == static_cast<int>(held.size()) && compared > 0,
                   "every parameter of the rank's stages compared");
        });
      }
    }
}

TEST_CASE(
    "a stage that cannot take what the previous one passes, or another schedule, fails on "
    "every rank before any step",
    "[pipeline]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int s = pg.rank();
    auto model = gpt();
    Generator gen(1);
    // Stage 1 expects width 5; stage 0 passes width 8.
    std::shared_ptr<nn::Module> part =
        s == 0 ? stage_of(*model, 0, 2)
               : std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(5, kVocab, gen));
    auto stage = std::make_shared<pipeline::PipelineStage>(part, s, 2, borrow(pg));
    pipeline::Schedule schedule(stage, pipeline::gpipe(2, 2), loss_fn);
    auto [x, y] = batch(4);
    EXPECT_THROWS(c, InvalidArgumentError,
                  schedule.step(s == 0 ? x : Tensor(), s == 1 ? y : Tensor()),
                  "stage 1 cannot run what stage 0 passes", "(2,8,8) float64");
  });
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int s = pg.rank();
    auto model = gpt();
    auto stage =
        std::make_shared<pipeline::PipelineStage>(stage_of(*model, s, 2), s, 2, borrow(pg));
    pipeline::Schedule schedule(stage, s == 0 ? pipeline::gpipe(2, 2) : pipeline::one_f_one_b(2, 2),
                                loss_fn);
    auto [x, y] = batch(4);
    EXPECT_THROWS(c, InvalidArgumentError,
                  schedule.step(s == 0 ? x : Tensor(), s == 1 ? y : Tensor()),
                  "rank 1 runs another schedule than rank 0",
                  "differ:\nrank 0: stage 0: F0 F1 B1 B0\nrank 1: stage 0: F0 F1 B0 B1\n");
  });
}

namespace {

// A part of a 4-stage float64 network with skip connections: stage 0 stashes "a" (popped by
// stage 2) and "b" (popped by stage 3, over two stages), stage 1 stashes "c" (popped by 3).
struct SkipPart : nn::Module {
  int index;
  std::shared_ptr<nn::Linear> lin;
  SkipPart(int index, Generator& gen)
      : Module("SkipPart"), index(index), lin(std::make_shared<nn::Linear>(6, 6, gen)) {
    register_module("lin", lin);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*lin)(x).tanh();
    switch (index) {
      case 0:
        pipeline::stash("a", h);
        pipeline::stash("b", h * h);
        return h;
      case 1:
        pipeline::stash("c", h * 2.0);
        return h;
      case 2:
        return h + pipeline::pop("a");
      default:
        return h * pipeline::pop("b") + pipeline::pop("c");
    }
  }
};

std::vector<std::shared_ptr<SkipPart>> skip_parts() {
  Generator gen(21);
  std::vector<std::shared_ptr<SkipPart>> parts;
  for (int i = 0; i < 4; ++i) {
    parts.push_back(std::make_shared<SkipPart>(i, gen));
    parts.back()->to(kFloat64);
  }
  return parts;
}

Tensor mse(const Tensor& y, const Tensor& target) { return ((y - target) * (y - target)).mean(); }

}  // namespace

TEST_CASE(
    "skip connections across stages: float64 gradients equal the unpipelined model's on 4 "
    "ranks and interleaved on 2, where a skip stays on its rank",
    "[pipeline]") {
  Generator gen(4);
  const Tensor x = randn({10, 6}, gen, kFloat64), y = randn({10, 6}, gen, kFloat64);
  // The same modules in one piece: stash and pop hand over on this thread.
  auto reference = skip_parts();
  Tensor h = x;
  for (auto& part : reference) h = (*part)(h);
  mse(h, y).backward();
  for (const auto& [p, name] : std::vector<std::pair<int, std::string>>{
           {4, "gpipe"}, {4, "1f1b"}, {4, "zb"}, {2, "interleaved"}}) {
    const int m = name == "interleaved" ? 2 : 5;
    INFO(p << " ranks, " << name);
    run_ranks(p, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      auto parts = skip_parts();
      std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
      for (int s = pg.rank(); s < 4; s += p)
        mine.push_back(std::make_shared<pipeline::PipelineStage>(parts[static_cast<size_t>(s)], s,
                                                                 4, borrow(pg)));
      pipeline::Schedule schedule(mine, pipeline::make_plan(name, p, m), mse);
      for (int step = 0; step < 2; ++step) {  // the second reuses the buffers
        for (auto& part : parts) part->zero_grad();
        schedule.step(pg.rank() == 0 ? x : Tensor(), pg.rank() == 3 % p ? y : Tensor());
      }
      for (const auto& st : mine) {
        const auto i = static_cast<size_t>(st->index());
        const Tensor got = parts[i]->lin->weight.grad(), want = reference[i]->lin->weight.grad();
        c.expect(
            got.defined() && allclose(got, want, 1e-12, 1e-14) &&
                allclose(parts[i]->lin->bias.grad(), reference[i]->lin->bias.grad(), 1e-12, 1e-14),
            "stage " + std::to_string(i) + "'s gradients");
      }
    });
  }
}

TEST_CASE(
    "a skip that no stage pops, or that a stage pops before it was stashed, fails on every "
    "rank before any step",
    "[pipeline]") {
  for (const bool popped_early : {false, true}) {
    run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      struct Part : nn::Module {
        int index;
        bool early;
        Part(int index, bool early) : Module("Part"), index(index), early(early) {}
        Tensor forward(const Tensor& x) override {
          if (index == 0 && !early) pipeline::stash("lost", x);
          if (index == 0 && early) return x + pipeline::pop("later");
          if (index == 1 && early) pipeline::stash("later", x);
          return x * 2.0;
        }
      };
      auto stage = std::make_shared<pipeline::PipelineStage>(
          std::make_shared<Part>(pg.rank(), popped_early), pg.rank(), 2, borrow(pg));
      pipeline::Schedule schedule(stage, pipeline::gpipe(2, 2), mse);
      const Tensor x = ones({4, 3}, kFloat64);
      if (popped_early)
        EXPECT_THROWS(c, InvalidArgumentError, schedule.step(x, x), "stage 0 pops \"later\"",
                      "which no earlier stage stashed");
      else
        EXPECT_THROWS(c, InvalidArgumentError, schedule.step(x, x), "no stage pops \"lost\"",
                      "stage 0 stashes");
    });
  }
  // A middle stage fails before the first step while a skip travels past it: every rank hears.
  run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    struct Part : nn::Module {
      int index;
      explicit Part(int index) : Module("Part"), index(index) {}
      Tensor forward(const Tensor& x) override {
        if (index == 0) pipeline::stash("past", x);
        GW_CHECK(index != 1, InvalidArgumentError, "stage 1 breaks");
        return index == 2 ? x + pipeline::pop("past") : x * 2.0;
      }
    };
    auto stage = std::make_shared<pipeline::PipelineStage>(std::make_shared<Part>(pg.rank()),
                                                           pg.rank(), 3, borrow(pg));
    pipeline::Schedule schedule(stage, pipeline::one_f_one_b(3, 2), mse);
    const Tensor x = ones({4, 3}, kFloat64);
    EXPECT_THROWS(c, InvalidArgumentError, schedule.step(x, x), "stage 1 cannot run",
                  "stage 1 breaks");
  });
  CHECK_THROWS_WITH(pipeline::pop("never"), Catch::Contains("pop of \"never\"") &&
                                                Catch::Contains("no forward on this thread"));
}

TEST_CASE(
    "a weight tied across two stages on one rank (interleaved): it stays one tensor, gets both "
    "stages' gradients summed, and SGD trains as the unpipelined model",
    "[pipeline]") {
  // 2 ranks x 2 stages: rank 0 holds stages 0 and 2, which share the embedding's weight. Each
  // stage's backward adds its part to the one .grad (stage 2's micro-batches first, then stage
  // 0's), and the rank's optimizer takes the tensor once (optimizers refuse one listed twice).
  // 3 SGD steps against the same modules run in one piece on the whole batch, whose tied
  // weight gets the sum of its two uses' gradients.
  constexpr int kMicro = 2, kSteps = 3;
  constexpr double kLr = 0.5;
  auto [x, y] = batch(2 * kMicro);
  auto reference = tied_parts();
  optim::SGD ref_opt(each_once(reference), optim::SGD::options(kLr));
  for (int step = 0; step < kSteps; ++step) {
    ref_opt.zero_grad();
    Tensor h = x;
    for (const auto& part : reference) h = (*part)(h);
    loss_fn(h, y).backward();
    ref_opt.step();
  }
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto parts = tied_parts();
    std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
    std::vector<std::shared_ptr<nn::Module>> held;
    for (int s = pg.rank(); s < 4; s += 2) {
      held.push_back(parts[static_cast<size_t>(s)]);
      mine.push_back(std::make_shared<pipeline::PipelineStage>(held.back(), s, 4, borrow(pg)));
    }
    optim::SGD opt(each_once(held), optim::SGD::options(kLr));
    pipeline::Schedule schedule(mine, pipeline::make_plan("interleaved", 2, kMicro), loss_fn);
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      schedule.step(pg.rank() == 0 ? x : Tensor(), pg.rank() == 1 ? y : Tensor());
      opt.step();
    }
    for (int s = pg.rank(); s < 4; s += 2) {
      const auto got = parts[static_cast<size_t>(s)]->named_parameters();
      const auto want = reference[static_cast<size_t>(s)]->named_parameters();
      c.expect(got.size() == want.size() && !got.empty(), "every parameter compared");
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        const Tensor& p = got[i].second;
        const Tensor& q = want[i].second;
        c.expect(allclose(p, q, 1e-12, 1e-14) && p.grad().defined() &&
                     allclose(p.grad(), q.grad(), 1e-12, 1e-14),
                 "stage " + std::to_string(s) + ": " + got[i].first +
                     " after 3 steps, and its last gradient");
      }
    }
    if (pg.rank() == 0) {
      const Tensor embedding = parts[0]->parameters()[0], projection = parts[2]->parameters()[0];
      EXPECT(c, embedding.same(projection));
      EXPECT(c, each_once(held).size() == 1);
    }
  });
}

TEST_CASE("1000 steps with random delays per stage finish on 4 Gloo ranks, three schedules",
          "[pipeline]") {
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    EXPECT(c, allclose(pipeline::testing::run_jittery(borrow(pg), 1000), full({3}, 2.0)));
  });
}

TEST_CASE(
    "a batch of another shape fails its rank at once and the other within the group's "
    "timeout; both schedules then refuse to step",
    "[pipeline]") {
  run_ranks(
      2,
      [&](dist::ProcessGroupGloo& pg, Checks& c) {
        const int s = pg.rank();
        auto model = gpt();
        auto stage =
            std::make_shared<pipeline::PipelineStage>(stage_of(*model, s, 2), s, 2, borrow(pg));
        pipeline::Schedule schedule(stage, pipeline::one_f_one_b(2, 2), loss_fn);
        auto [x, y] = batch(4);
        schedule.step(s == 0 ? x : Tensor(), s == 1 ? y : Tensor());
        // The last stage is given targets of 3 tokens per sequence instead of 8.
        const Tensor shorter = y.narrow(1, 0, 3).contiguous();
        if (s == 1)
          EXPECT_THROWS(c, InvalidArgumentError, schedule.step(Tensor(), shorter),
                        "target micro-batches are (2,3)", "(2,8) since its first step");
        else
          EXPECT_THROWS(c, std::exception, schedule.step(x, Tensor()), "rank 0");
        EXPECT_THROWS(c, StateError, schedule.step(s == 0 ? x : Tensor(), s == 1 ? y : Tensor()),
                      "an earlier step failed midway");
      },
      {.timeout = std::chrono::seconds(2)});
}

TEST_CASE(
    "a first batch that does not split, or is empty, is refused on both ranks; a good one "
    "then steps",
    "[pipeline]") {
  run_ranks(2,
            [&](dist::ProcessGroupGloo& pg, Checks& c) {
              const int s = pg.rank();
              auto model = gpt();
              auto stage = std::make_shared<pipeline::PipelineStage>(stage_of(*model, s, 2), s, 2,
                                                                     borrow(pg));
              pipeline::Schedule schedule(stage, pipeline::one_f_one_b(2, 2), loss_fn);
              auto [x, y] = batch(4);
              // Before the first step the stages exchange shapes: a refusal there leaves nothing in
              // flight, so the schedule takes the next batch.
              EXPECT_THROWS(c, std::exception,
                            schedule.step(s == 0 ? x.narrow(0, 0, 3) : Tensor(),
                                          s == 1 ? y.narrow(0, 0, 3) : Tensor()),
                            "2 micro-batches of one size");
              EXPECT_THROWS(c, std::exception,
                            schedule.step(s == 0 ? x.narrow(0, 0, 0) : Tensor(),
                                          s == 1 ? y.narrow(0, 0, 0) : Tensor()),
                            "2 micro-batches of one size");
              std::vector<double> losses;
              schedule.step(s == 0 ? x : Tensor(), s == 1 ? y : Tensor(), &losses);
              if (s == 1) EXPECT(c, losses.size() == 2 && std::isfinite(losses[0]));
            },
            {.timeout = std::chrono::seconds(10)});
}

TEST_CASE(
    "an error on one rank only in the shape exchange (the first stage's input, the last "
    "stage's loss) fails every rank of an interleaved pipeline at once, naming it; the next "
    "step runs",
    "[pipeline]") {
  // 2 ranks x 2 stages. Rank 0's tokens are longer than the model's context: stage 0's forward
  // fails on rank 0 alone, and its failure travels down the chain (stages 1, 2 and 3, across
  // both ranks twice) in place of the shapes. Then rank 1's targets do not fit the logits: the
  // loss fails on rank 1 alone (the last stage), and rank 0 learns of it when the ranks compare
  // their reports. Either way every rank throws the same InvalidArgumentError well within the
  // group's timeout (5 s): none is left waiting for a message the failed rank never sends. A
  // refusal in the exchange leaves nothing in flight, so the next, good, step runs.
  constexpr int kMicro = 2;
  constexpr auto kTimeout = std::chrono::seconds(5);
  run_ranks(
      2,
      [&](dist::ProcessGroupGloo& pg, Checks& c) {
        const int r = pg.rank();
        auto model = gpt();
        std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
        for (int s = r; s < 4; s += 2)
          mine.push_back(
              std::make_shared<pipeline::PipelineStage>(stage_of(*model, s, 4), s, 4, borrow(pg)));
        pipeline::Schedule schedule(mine, pipeline::make_plan("interleaved", 2, kMicro), loss_fn);
        auto [x, y] = batch(2 * kMicro);
        Generator gen(3);
        const Tensor too_long = randint(0, kVocab, {2 * kMicro, kLength + 1}, gen);
        const Tensor too_short = y.narrow(1, 0, kLength - 1).contiguous();
        auto fails_fast = [&](const Tensor& input, const Tensor& target, const char* who,
                              const char* why) {
          const auto start = std::chrono::steady_clock::now();
          EXPECT_THROWS(c, InvalidArgumentError,
                        schedule.step(r == 0 ? input : Tensor(), r == 1 ? target : Tensor()), who,
                        why);
          c.expect(std::chrono::steady_clock::now() - start < kTimeout,
                   "rank " + std::to_string(r) + " failed within the group's timeout");
        };
        fails_fast(too_long, y, "[pipeline] stage 0 cannot run its input", "expects tokens");
        fails_fast(x, too_short, "[pipeline] stage 3 cannot run", "[cross_entropy]");
        std::vector<double> losses;
        schedule.step(r == 0 ? x : Tensor(), r == 1 ? y : Tensor(), &losses);
        if (r == 1) EXPECT(c, losses.size() == size_t{kMicro} && std::isfinite(losses[0]));
      },
      {.timeout = kTimeout});
}

TEST_CASE(
    "ranks whose plans differ in micro-batches, one past MPI's message tags, fail every rank "
    "in the shape exchange",
    "[pipeline]") {
  // Rank 0 runs GPipe over 8192 micro-batches (message tags up to 32769, past MPI's 32767),
  // rank 1 over 2. The exchange refuses a plan past MPI's tags only once the ranks compared
  // their plans (it once refused first, on rank 0 alone, and rank 1 waited for rank 0's report
  // until the group's timeout): every rank throws InvalidArgumentError naming the plans, at
  // once. Rank 0 stays alive meanwhile (a latch, not its group), as a process that caught the
  // error would.
  constexpr auto kTimeout = std::chrono::seconds(2);
  std::latch tried(2);
  run_ranks(
      2,
      [&](dist::ProcessGroupGloo& pg, Checks& c) {
        struct Arrive {  // however this rank leaves, the other is not left waiting for it
          std::latch& latch;
          ~Arrive() { latch.arrive_and_wait(); }
        } arrive{tried};  // first: destroyed last, after anything below that throws
        const int r = pg.rank();
        struct Double : nn::Module {
          Double() : Module("Double") {}
          Tensor forward(const Tensor& x) override { return x * 2.0; }
        };
        const int m = r == 0 ? 8192 : 2;
        auto stage =
            std::make_shared<pipeline::PipelineStage>(std::make_shared<Double>(), r, 2, borrow(pg));
        pipeline::Schedule schedule(stage, pipeline::gpipe(2, m), mse);
        const Tensor batch_rows = ones({m, 3}, kFloat64);
        const auto start = std::chrono::steady_clock::now();
        EXPECT_THROWS(c, InvalidArgumentError,
                      schedule.step(r == 0 ? batch_rows : Tensor(), r == 1 ? batch_rows : Tensor()),
                      "[pipeline] rank 1 runs another schedule than rank 0");
        c.expect(std::chrono::steady_clock::now() - start < kTimeout,
                 "rank " + std::to_string(r) + " failed before the group's timeout");
      },
      {.timeout = kTimeout});
}

namespace {
// `world_size - 1` pipeline_peer processes running `scenario` over Gloo, and this process as
// rank 0 of the default group (it runs the store).
struct PeerPipeline {
  std::shared_ptr<store::TCPStore> store =
      std::make_shared<store::TCPStore>("127.0.0.1", 0, -1, true, std::chrono::seconds(60));
  test::PeerProcesses peers;
  std::shared_ptr<dist::ProcessGroup> pg;
  PeerPipeline(int world_size, const std::string& scenario)
      : peers(GW_PIPELINE_PEER, world_size, store->port(), {scenario}),
        pg(dist::init_process_group("gloo", store, 0, world_size)) {}
  ~PeerPipeline() {
    pg.reset();
    dist::destroy_process_group();
  }
};
}  // namespace

TEST_CASE(
    "a pipeline of 4 processes runs 1000 jittery steps; a rank that dies mid-step fails "
    "the other at once",
    "[pipeline][process]") {
  {
    PeerPipeline p(4, "steps");
    CHECK(allclose(pipeline::testing::run_jittery(p.pg, 1000), full({3}, 2.0)));
    CHECK(p.peers.wait() == std::vector<int>{0, 0, 0});
  }
  PeerPipeline p(2, "die");
  const auto started = std::chrono::steady_clock::now();
  // Rank 1 ends its process in step 20's forward; rank 0 waits for its gradient then. The
  // group's timeout is 30 minutes: the error comes from the lost connection.
  CHECK_THROWS_WITH(pipeline::testing::run_jittery(p.pg, 1000),
                    Catch::Contains("rank 0 of 2") && Catch::Contains("recv"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
  CHECK(p.peers.wait() == std::vector<int>{3});
}

TEST_CASE("a pipeline of 4 MPI processes runs 1000 jittery steps under mpirun",
          "[pipeline][mpi][process]") {
  GW_SKIP_WITHOUT_MPIRUN();
  const auto run = test::mpirun(4, std::string(GW_PIPELINE_PEER) + " mpi steps", "", 300);
  INFO(run.output);
  CHECK(run.exit_code == 0);
  for (int r = 0; r < 4; ++r)
    CHECK(run.output.find("rank " + std::to_string(r) + ": ok") != std::string::npos);
}
