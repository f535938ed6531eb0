// Pipeline parallelism: schedules as data (complete, deadlock-free, activations held), and a
// GPT cut into 2 and 4 stages on ranks that are threads over real Gloo, whose float64 gradients
// equal the whole model's on the whole batch for every schedule and micro-batch count; stages
// that cannot take what they are given, and ranks that run different schedules, fail on every
// rank before any step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "core/ops.h"
#include "nn/nn.h"
#include "pipeline/schedule.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using gw::pipeline::ActionType;
using gw::pipeline::Plan;

namespace {

// The most micro-batches stage s holds at once (forwards run, backwards not yet).
int most_in_flight(const Plan& plan, size_t s) {
  int held = 0, most = 0;
  for (const auto& a : plan[s]) {
    held += a.type == ActionType::Forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

constexpr int64_t kVocab = 11, kLength = 8, kLayers = 4;

std::shared_ptr<nn::GPT> gpt() {
  Generator gen(5);
  auto model = std::make_shared<nn::GPT>(nn::GPTOptions{.vocab_size = kVocab,
                                                        .context = kLength,
                                                        .layers = kLayers,
                                                        .heads = 2,
                                                        .width = 8,
                                                        .dropout = 0.0,
                                                        .bias = true,
                                                        .tie_weights = false},
                                         gen);
  model->to(kFloat64);
  return model;
}

// The GPT's embeddings and its head, as modules of their own (sharing its parameters).
struct Embed : nn::Module {
  std::shared_ptr<nn::Embedding> wte, wpe;
  explicit Embed(const nn::GPT& g) : Module("Embed") {
    wte = register_module("wte", g.wte);
    wpe = register_module("wpe", g.wpe);
  }
  Tensor forward(const Tensor& tokens) override {
    return (*wte)(tokens) + (*wpe)(arange(tokens.size(1), kInt64));
  }
};
struct Head : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;
  explicit Head(const nn::GPT& g) : Module("Head") {
    ln_f = register_module("ln_f", g.ln_f);
    lm_head = register_module("lm_head", g.lm_head);
  }
  Tensor forward(const Tensor& x) override { return (*lm_head)((*ln_f)(x)); }
};

// Stage s of `stages`: its share of the blocks, the embeddings before the first, the head after
// the last.
std::shared_ptr<nn::Module> stage_of(const nn::GPT& g, int s, int stages) {
  auto part = std::make_shared<nn::Sequential>();
  if (s == 0) part->push_back(std::make_shared<Embed>(g));
  const auto blocks = g.h->children();
  const int per_stage = static_cast<int>(blocks.size()) / stages;
  for (int b = s * per_stage; b < (s + 1) * per_stage; ++b) part->push_back(blocks[b]);
  if (s == stages - 1) part->push_back(std::make_shared<Head>(g));
  return part;
}

Tensor loss_fn(const Tensor& logits, const Tensor& targets) {
  return nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
}

std::pair<Tensor, Tensor> batch(int64_t n) {
  Generator gen(77);
  Tensor t = randint(0, kVocab, {n, kLength + 1}, gen);
  return {t.narrow(1, 0, kLength).contiguous(), t.narrow(1, 1, kLength).contiguous()};
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

}  // namespace

TEST_CASE("GPipe and 1F1B plans are complete, deadlock-free, and 1F1B holds fewer activations",
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
    }
  CHECK(pipeline::to_string(pipeline::one_f_one_b(2, 3)) ==
        "stage 0: F0 F1 B0 F2 B1 B2\nstage 1: F0 B0 F1 B1 F2 B2\n");
  CHECK(pipeline::make_plan("gpipe", 2, 2) == pipeline::gpipe(2, 2));
  CHECK_THROWS_WITH(pipeline::make_plan("zb", 2, 2), Catch::Contains("gpipe or 1f1b"));
}

TEST_CASE("a plan that would deadlock or skips a micro-batch is refused, naming why",
          "[pipeline]") {
  using A = pipeline::Action;
  constexpr auto F = ActionType::Forward;
  constexpr auto B = ActionType::Backward;
  // Stage 0 waits for B0 from stage 1, which waits for F1 from stage 0.
  const Plan crossed{{A{F, 0}, A{B, 0}, A{F, 1}, A{B, 1}}, {A{F, 1}, A{F, 0}, A{B, 0}, A{B, 1}}};
  CHECK_THROWS_WITH(pipeline::check_plan(crossed, 2, 2),
                    Catch::Contains("deadlocks") && Catch::Contains("stage 0 waits in B0") &&
                        Catch::Contains("stage 1 waits in F1"));
  const Plan missing{{A{F, 0}, A{B, 0}}, {A{F, 0}}};
  CHECK_THROWS_WITH(
      pipeline::check_plan(missing, 2, 1),
      Catch::Contains("stage 1 runs micro-batch 0's forward 1 times and its backward 0"));
  const Plan early{{A{B, 0}, A{F, 0}}};
  CHECK_THROWS_WITH(pipeline::check_plan(early, 1, 1), Catch::Contains("B0 before its forward"));
}

TEST_CASE(
    "a GPT cut into 2 and 4 stages: float64 gradients equal the whole model's, for every "
    "schedule and micro-batch count",
    "[pipeline]") {
  for (int p : {2, 4})
    for (const char* name : {"gpipe", "1f1b"})
      for (int m : {1, p, 2 * p + 1}) {
        INFO(p << " stages, " << name << ", " << m << " micro-batches");
        run_ranks(p, [&](dist::ProcessGroupGloo& pg, Checks& c) {
          const int s = pg.rank();
          auto model = gpt();
          auto stage =
              std::make_shared<pipeline::PipelineStage>(stage_of(*model, s, p), s, p, borrow(pg));
          pipeline::Schedule schedule(stage, pipeline::make_plan(name, p, m), loss_fn);
          auto [x, y] = batch(2 * m);
          std::vector<double> losses;
          for (int step = 0; step < 2; ++step) {  // the second reuses the buffers
            model->zero_grad();
            losses.clear();
            schedule.step(s == 0 ? x : Tensor(), s == p - 1 ? y : Tensor(), &losses);
          }
          auto reference = gpt();
          const Tensor whole = reference->loss(x, y);
          whole.backward();
          if (s == p - 1) {
            double mean = 0;
            for (double l : losses) mean += l / m;
            c.expect(static_cast<int>(losses.size()) == m &&
                         std::abs(mean - whole.item<double>()) < 1e-12,
                     "the micro-batches' mean loss is the whole batch's");
          }
          const auto mine = stage->module().parameters();
          const auto params = model->named_parameters(), wants = reference->named_parameters();
          int compared = 0;
          for (size_t i = 0; i < params.size(); ++i) {
            const Tensor& p_i = params[i].second;
            const bool in_stage =
                std::any_of(mine.begin(), mine.end(), [&](const Tensor& t) { return t.same(p_i); });
            if (!in_stage) {
              c.expect(!p_i.grad().defined(), params[i].first + ": no gradient off its stage");
              continue;
            }
            ++compared;
            c.expect(
                p_i.grad().defined() && allclose(p_i.grad(), wants[i].second.grad(), 1e-12, 1e-14),
                params[i].first + "'s gradient");
          }
          c.expect(compared == static_cast<int>(mine.size()) && compared > 0,
                   "every parameter of the stage compared");
        });
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
                  "rank 1 runs another schedule than rank 0");
  });
}

namespace {
// A stage that sleeps a random 0-100 us in each forward: the ranks drift apart.
struct Jittery : nn::Module {
  Tensor w;
  std::mt19937 rng;
  explicit Jittery(int seed) : Module("Jittery"), rng(static_cast<uint32_t>(seed)) {
    w = register_parameter("w", ones({3}));
  }
  Tensor forward(const Tensor& x) override {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
    return x * w;
  }
};
}  // namespace

TEST_CASE("1000 steps with random delays per stage finish on 4 Gloo ranks, both schedules",
          "[pipeline]") {
  run_ranks(4, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int s = pg.rank();
    auto module = std::make_shared<Jittery>(s);
    auto stage = std::make_shared<pipeline::PipelineStage>(module, s, 4, borrow(pg));
    auto sum = [](const Tensor& y, const Tensor&) { return y.sum(); };
    pipeline::Schedule gpipe(stage, pipeline::gpipe(4, 3), sum);
    pipeline::Schedule one_f_one_b(stage, pipeline::one_f_one_b(4, 3), sum);
    const Tensor x = ones({6, 3});
    int steps = 0;
    for (int step = 0; step < 1000; ++step, ++steps) {
      module->zero_grad();
      (step % 2 ? gpipe : one_f_one_b).step(x, x);
    }
    EXPECT(c, steps == 1000);
    // d(sum of x * w^4 over the batch)/dw on each stage, every w 1: 6 rows, each loss / 3.
    EXPECT(c, allclose(module->w.grad(), full({3}, 6.0 / 3)));
  });
}
