// Pipelines with data parallelism (2D): replicas of a GPT pipeline on 4 thread-ranks over real
// Gloo, each on its share of the batch, whose float64 gradients equal the whole model's on the
// whole batch; a weight tied across two stages of a rank averaged once; each stage sharded by
// FSDP over its replicas.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "debug/flight_recorder.h"
#include "fsdp/fully_shard.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "pipeline/schedule.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/pipeline/pipeline_models.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using namespace pipeline_test;

namespace {

// This thread-rank's groups in a mesh of (world / ranks) replicas of a pipeline of `ranks`,
// placed as init_device_mesh({replicas, ranks}, {"dp", "pp"}) places them: its pipeline (a row)
// and its replicas (a column, made with `dp_options`), made over `groups`, which the test's
// ranks share.
std::pair<std::shared_ptr<dist::ProcessGroupGloo>, std::shared_ptr<dist::ProcessGroupGloo>>
mesh_groups(const dist::ProcessGroupGloo& world, int ranks,
            const std::shared_ptr<store::HashStore>& groups, dist::GlooOptions dp_options = {}) {
  const int replica = world.rank() / ranks, r = world.rank() % ranks;
  return {
      std::make_shared<dist::ProcessGroupGloo>(
          std::make_shared<store::PrefixStore>("pp" + std::to_string(replica), groups), r, ranks),
      std::make_shared<dist::ProcessGroupGloo>(
          std::make_shared<store::PrefixStore>("dp" + std::to_string(r), groups), replica,
          world.size() / ranks, std::move(dp_options))};
}

}  // namespace

TEST_CASE(
    "2D: two replicas of a 2-stage GPT pipeline on 4 ranks, each on half the batch: float64 "
    "gradients equal the whole model's on the whole batch, under 1F1B and zero bubble, and with "
    "one replica on 1F1B, the other on GPipe (one stage a rank: they average alike)",
    "[pipeline]") {
  constexpr int kStages = 2, kReplicas = 2, kMicro = 3;
  auto [x, y] = batch(2 * kReplicas * kMicro);
  auto reference = gpt();
  reference->loss(x, y).backward();
  const auto wants = reference->named_parameters();
  for (const auto& [name, other] : std::vector<std::pair<std::string, std::string>>{
           {"1f1b", "1f1b"}, {"zb", "zb"}, {"1f1b", "gpipe"}}) {
    INFO(name << " and " << other);
    auto groups = std::make_shared<store::HashStore>();  // the mesh's rows and columns
    run_ranks(kStages * kReplicas, [&](dist::ProcessGroupGloo& world, Checks& c) {
      const auto [pp, dp] = mesh_groups(world, kStages, groups);
      const int replica = dp->rank(), s = pp->rank();
      auto model = gpt();
      auto part = stage_of(*model, s, kStages);
      pipeline::Schedule schedule(std::make_shared<pipeline::PipelineStage>(part, s, kStages, pp),
                                  pipeline::make_plan(replica == 0 ? name : other, kStages, kMicro),
                                  loss_fn, {.data_parallel = dp});
      const int64_t rows = x.size(0) / kReplicas;
      const Tensor my_x = x.narrow(0, replica * rows, rows),
                   my_y = y.narrow(0, replica * rows, rows);
      for (int step = 0; step < 2; ++step) {
        model->zero_grad();
        schedule.step(s == 0 ? my_x : Tensor(), s == kStages - 1 ? my_y : Tensor());
      }
      const auto params = model->named_parameters();
      int compared = 0;
      for (const Tensor& t : part->parameters())
        for (size_t i = 0; i < params.size(); ++i) {
          if (!params[i].second.same(t)) continue;
          ++compared;
          c.expect(t.grad().defined() && allclose(t.grad(), wants[i].second.grad(), 1e-12, 1e-14),
                   "replica " + std::to_string(replica) + ", " + params[i].first);
        }
      c.expect(compared == static_cast<int>(part->parameters().size()) && compared > 0,
               "every parameter of the stage compared");
    });
  }
}

TEST_CASE(
    "2D: replicas whose averages would not pair up, or one that cannot run, are refused on every "
    "rank before any step",
    "[pipeline][errors]") {
  constexpr int kStages = 2, kReplicas = 2, kMicro = 3;
  auto [x, y] = batch(2 * kReplicas * kMicro);
  // Replica 1: a frozen parameter in stage 0 only (rank 1's stages agree: it learns from rank 0),
  // or an input longer than the model's context (its replica 0 would wait on its averages).
  for (const std::string odd : {"frozen", "too long"}) {
    INFO(odd);
    auto groups = std::make_shared<store::HashStore>();
    run_ranks(kStages * kReplicas, [&](dist::ProcessGroupGloo& world, Checks& c) {
      const auto [pp, dp] = mesh_groups(world, kStages, groups);
      const int replica = dp->rank(), s = pp->rank();
      auto model = gpt();
      auto part = stage_of(*model, s, kStages);
      const bool mine = replica == 1;
      if (mine && odd == "frozen" && s == 0) part->parameters().front().requires_grad_(false);
      pipeline::Schedule schedule(std::make_shared<pipeline::PipelineStage>(part, s, kStages, pp),
                                  pipeline::make_plan("1f1b", kStages, kMicro), loss_fn,
                                  {.data_parallel = dp});
      const int64_t rows = x.size(0) / kReplicas;
      Tensor my_x = x.narrow(0, replica * rows, rows);
      if (mine && odd == "too long") my_x = cat({my_x, my_x}, 1);
      auto step = [&] {
        schedule.step(s == 0 ? my_x : Tensor(),
                      s == kStages - 1 ? y.narrow(0, replica * rows, rows) : Tensor());
      };
      if (odd == "frozen")
        EXPECT_THROWS(c, InvalidArgumentError, step(), "replica 1 of rank 0's stages",
                      "stage 0 parameter 0: float64");
      else
        EXPECT_THROWS(c, InvalidArgumentError, step(),
                      replica == 0 ? "[pipeline] replica 1 cannot take its first step: stage 0 "
                                     "cannot run"
                                   : "[pipeline] stage 0 cannot run");
      EXPECT(c, !part->parameters().back().grad().defined());  // nothing ran
    });
  }
  // Replica 1's stage 2 with a weight of its own, where replica 0's shares stage 0's: its
  // averages would leave the two apart (2 ranks x 4 stages, interleaved).
  auto groups = std::make_shared<store::HashStore>();
  run_ranks(2 * kReplicas, [&](dist::ProcessGroupGloo& world, Checks& c) {
    const int r = world.rank() % 2;
    const auto [pp, dp] = mesh_groups(world, 2, groups);
    auto parts = tied_parts();
    if (dp->rank() == 1) {
      auto proj = std::dynamic_pointer_cast<nn::Linear>(
          std::dynamic_pointer_cast<TiedPart>(parts[2])->layer);
      proj->tie_weight(proj->weight.detach().clone().requires_grad_());
    }
    std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
    for (int s = r; s < 4; s += 2)
      mine.push_back(
          std::make_shared<pipeline::PipelineStage>(parts[static_cast<size_t>(s)], s, 4, pp));
    pipeline::Schedule schedule(mine, pipeline::make_plan("interleaved", 2, 2), loss_fn,
                                {.data_parallel = dp});
    EXPECT_THROWS(
        c, InvalidArgumentError,
        schedule.step(r == 0 ? x.narrow(0, 0, 4) : Tensor(), r == 1 ? y.narrow(0, 0, 4) : Tensor()),
        "replica 1 of rank 0's stages", "stage 2 parameter 0: tied to stage 0 parameter 0");
  });
}

TEST_CASE(
    "2D with a weight tied across two stages of a rank: averaged over the replicas once, after "
    "both stages' backwards, through TCP Gloo's flat copy; gradients equal the whole model's",
    "[pipeline]") {
  // 2 replicas x (2 ranks x 2 stages, interleaved): rank 0 of each pipeline holds stages 0 and
  // 2, which share the embedding's weight. Stage 2's last backward ends first while stage 0's
  // still add into the shared .grad: an average started then would race with them, or — on
  // Gloo over TCP, which reduces a flat copy and copies it back — overwrite what they add. It is
  // averaged once a step, at stage 0's last backward: the flight recorder counts the replica
  // groups' allreduces (averaged at both stages, which is the same arithmetic, the gradients
  // came out wrong one run in four). Against the modules run in one piece on the whole batch:
  // every gradient equal, two steps in a row.
  constexpr int kRanks = 2, kReplicas = 2, kMicro = 2;
  auto [x, y] = batch(2 * kReplicas * kMicro);
  auto reference = tied_parts();
  Tensor h = x;
  for (const auto& part : reference) h = (*part)(h);
  loss_fn(h, y).backward();
  auto groups = std::make_shared<store::HashStore>();
  run_ranks(kRanks * kReplicas, [&](dist::ProcessGroupGloo& world, Checks& c) {
    const int r = world.rank() % kRanks;
    const auto [pp, dp] =
        mesh_groups(world, kRanks, groups,
                    {.group_name = "tied dp" + std::to_string(r), .shared_memory = false});
    const int replica = dp->rank();
    auto parts = tied_parts();
    std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
    for (int s = r; s < 4; s += kRanks)
      mine.push_back(
          std::make_shared<pipeline::PipelineStage>(parts[static_cast<size_t>(s)], s, 4, pp));
    pipeline::Schedule schedule(mine, pipeline::make_plan("interleaved", kRanks, kMicro), loss_fn,
                                {.data_parallel = dp});
    const int64_t rows = x.size(0) / kReplicas;
    for (int step = 0; step < 2; ++step) {
      for (const auto& part : parts) part->zero_grad();
      schedule.step(r == 0 ? x.narrow(0, replica * rows, rows) : Tensor(),
                    r == kRanks - 1 ? y.narrow(0, replica * rows, rows) : Tensor());
    }
    for (int s = r; s < 4; s += kRanks) {
      const auto got = parts[static_cast<size_t>(s)]->named_parameters();
      const auto want = reference[static_cast<size_t>(s)]->named_parameters();
      c.expect(got.size() == want.size() && !got.empty(), "every parameter compared");
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
        c.expect(got[i].second.grad().defined() &&
                     allclose(got[i].second.grad(), want[i].second.grad(), 1e-12, 1e-14),
                 "replica " + std::to_string(replica) + ", stage " + std::to_string(s) + ": " +
                     got[i].first);
    }
  });
  // Each step, in each replica: rank 0 averages stage 0's weight (the tied one) and nothing of
  // stage 2's (only the tied weight); rank 1 stage 1's and stage 3's (weight and bias each).
  std::map<std::string, int> averages;
  const nlohmann::json recorded = nlohmann::json::parse(debug::get_debug_info());
  for (const auto& e : recorded["events"])
    if (e["op"] == "allreduce_coalesced") ++averages[e["group"].get<std::string>()];
  CHECK(averages["tied dp0"] == 2 * kReplicas);
  CHECK(averages["tied dp1"] == 2 * 2 * kReplicas);
}

TEST_CASE(
    "2D with FSDP: two replicas of a GPT pipeline on 4 ranks, each stage sharded over its "
    "replicas: after an SGD step the gathered parameters equal the whole model's, under GPipe, "
    "1F1B and interleaved (two sharded stages a rank), reduce-scattering each micro-batch's "
    "gradients or only their sum after the last (before_backward)",
    "[pipeline][fsdp]") {
  constexpr int kRanks = 2, kReplicas = 2;
  constexpr double kLr = 0.5;
  for (const auto& [name, m, once] :
       std::vector<std::tuple<std::string, int, bool>>{{"gpipe", 3, false},
                                                       {"1f1b", 3, false},
                                                       {"interleaved", 2, false},
                                                       {"1f1b", 3, true},
                                                       {"interleaved", 2, true}}) {
    INFO(name << (once ? ", one reduce-scatter a step" : ""));
    const int stages = pipeline::stages_of(pipeline::make_plan(name, kRanks, m));
    auto [x, y] = batch(2 * kReplicas * m);
    auto reference = gpt();
    reference->loss(x, y).backward();
    {
      autograd::NoGradGuard no_grad;
      for (Tensor p : reference->parameters()) p.sub_(p.grad() * kLr);
    }
    std::vector<NamedTensors> wants;  // by stage, named as the stage module names them
    for (int s = 0; s < stages; ++s) wants.push_back(stage_of(*reference, s, stages)->state_dict());
    auto groups = std::make_shared<store::HashStore>();  // the mesh's rows and columns
    run_ranks(kRanks * kReplicas, [&](dist::ProcessGroupGloo& world, Checks& c) {
      const auto [pp, dp] = mesh_groups(world, kRanks, groups);
      const int replica = dp->rank(), r = pp->rank();
      auto model = gpt();
      std::vector<std::shared_ptr<pipeline::PipelineStage>> mine;
      std::vector<std::pair<int, std::shared_ptr<fsdp::FSDPModule>>> sharded;
      std::vector<Tensor> shards;
      for (int s = r; s < stages; s += kRanks) {
        auto part = stage_of(*model, s, stages);
        for (const auto& child : part->children())
          if (std::dynamic_pointer_cast<nn::GPTBlock>(child)) fsdp::fully_shard(child, dp);
        sharded.emplace_back(s, fsdp::fully_shard(part, dp));
        for (const Tensor& t : part->parameters()) shards.push_back(t);
        mine.push_back(std::make_shared<pipeline::PipelineStage>(part, s, stages, pp));
      }
      optim::SGD opt(shards, optim::SGD::options(kLr));
      pipeline::ScheduleOptions options;
      int lasts = 0;  // backwards told they are their stage's last
      if (once)
        options.before_backward = [&](int stage, bool last) {
          lasts += last;
          for (const auto& [s, unit] : sharded) {
            if (s != stage) continue;
            // Nothing was reduce-scattered into the shards before the last backward.
            if (last)
              for (const Tensor& t : unit->shards())
                c.expect(!t.grad().defined(), "no gradient in the shards before the last");
            unit->set_requires_gradient_sync(last);
          }
        };
      pipeline::Schedule schedule(mine, pipeline::make_plan(name, kRanks, m), loss_fn,
                                  std::move(options));
      const int64_t rows = x.size(0) / kReplicas;
      opt.zero_grad();
      schedule.step(r == 0 ? x.narrow(0, replica * rows, rows) : Tensor(),
                    r == (stages - 1) % kRanks ? y.narrow(0, replica * rows, rows) : Tensor());
      opt.step();
      if (once) c.expect(lasts == static_cast<int>(sharded.size()), "one last backward a stage");
      for (const auto& [s, unit] : sharded) {
        const NamedTensors got = unit->full_state_dict();
        const NamedTensors& want = wants[static_cast<size_t>(s)];
        c.expect(got.size() == want.size() && !got.empty(), "every parameter gathered");
        for (const auto& [key, value] : got) {
          auto it = want.find(key);
          c.expect(
              it != want.end() && allclose(value, it->second, 1e-12, 1e-14),
              "replica " + std::to_string(replica) + ", stage " + std::to_string(s) + ": " + key);
        }
      }
    });
  }
}
