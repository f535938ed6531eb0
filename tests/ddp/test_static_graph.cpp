// DDP's static_graph, ranks as threads over real Gloo: a parameter whose gradient hook fires
// twice per backward (used by a reentrant checkpoint and outside it) trains exactly as locally,
// where without static_graph it fails with PyTorch's message; an unused parameter needs no
// find_unused_parameters; a graph that changes later is refused by name.
#include <catch2/catch.hpp>

#include "autograd/activation_checkpoint.h"
#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;

namespace {
constexpr int64_t kShard = 5;  // samples per rank

// stem, then `block` twice — the first time inside a reentrant checkpoint when `checkpointed`
// — then head; `spare` is never used.
struct Twice : nn::Module {
  std::shared_ptr<nn::Linear> stem, block, head, spare;
  bool checkpointed = true;
  explicit Twice(uint64_t seed) : Module("Twice") {
    Generator gen(seed);
    stem = register_module("stem", std::make_shared<nn::Linear>(8, 12, true, gen));
    block = register_module("block", std::make_shared<nn::Linear>(12, 12, true, gen));
    head = register_module("head", std::make_shared<nn::Linear>(12, 4, true, gen));
    spare = register_module("spare", std::make_shared<nn::Linear>(12, 12, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = stem->forward(x).relu();
    auto segment = [this](const Tensor& t) { return block->forward(t).tanh(); };
    h = checkpointed ? autograd::checkpoint(segment, h) : segment(h);
    return head->forward(block->forward(h).tanh());
  }
};

std::pair<Tensor, Tensor> batch(int world, int step) {
  Generator gen(500 + static_cast<uint64_t>(step));
  return {randn({world * kShard, 8}, gen, kFloat64), randint(0, 4, {world * kShard}, gen)};
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

std::shared_ptr<Twice> twice(uint64_t seed, bool checkpointed) {
  auto m = std::make_shared<Twice>(seed);
  m->to(kFloat64);
  m->checkpointed = checkpointed;
  return m;
}

template <typename M>  // nn::Module or DistributedDataParallel
Tensor loss_of(M& m, const Tensor& x, const Tensor& y) {
  return nn::functional::cross_entropy(m.forward(x), y);
}
}  // namespace

TEST_CASE("static_graph: a parameter whose hook fires twice per backward trains as locally",
          "[ddp][static_graph]") {
  for (bool checkpointed : {true, false})
    for (bool as_view : {false, true}) {
      INFO("checkpointed " << checkpointed << ", gradient_as_bucket_view " << as_view);
      run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
        auto net = twice(pg.rank() == 0 ? 7 : 70 + pg.rank(), checkpointed);
        int block_hooks = 0;  // per backward: 2 with the checkpoint, else 1
        autograd::register_post_accumulate_grad_hook(net->block->parameters()[0],
                                                     [&](const Tensor&) { ++block_hooks; });
        ddp::DistributedDataParallel model(net, borrow(pg),
                                           {.first_bucket_cap_mb = 1e-3,
                                            .gradient_as_bucket_view = as_view,
                                            .static_graph = true});
        auto reference = twice(7, false);
        optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
        optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
        for (int step = 0; step < 4; ++step) {
          auto [x, y] = batch(3, step);
          opt.zero_grad();
          ref_opt.zero_grad();
          block_hooks = 0;
          loss_of(model, x.narrow(0, pg.rank() * kShard, kShard),
                  y.narrow(0, pg.rank() * kShard, kShard))
              .backward();
          EXPECT(c, block_hooks == (checkpointed ? 2 : 1));
          loss_of(*reference, x, y).backward();
          auto p = net->named_parameters(), q = reference->named_parameters();
          for (size_t i = 0; i < p.size(); ++i) {
            if (p[i].first.starts_with("spare")) {  // no rank uses it: untouched
              EXPECT(c, !p[i].second.grad().defined());
              continue;
            }
            EXPECT(c, allclose(p[i].second.grad(), q[i].second.grad(), 1e-10, 1e-12));
          }
          opt.step();
          ref_opt.step();
        }
        auto p = net->parameters(), q = reference->parameters();
        for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i], q[i], 1e-10, 1e-12));
        // Every step was reduced in buckets (the first iteration's at its end).
        EXPECT(c, model.reducer().launched() >= 4 * 2);
      });
    }
}

TEST_CASE("without static_graph, a hook that fires twice fails with PyTorch's message",
          "[ddp][static_graph]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(twice(7, true), borrow(pg),
                                       {.find_unused_parameters = true});
    auto [x, y] = batch(2, 0);
    EXPECT_THROWS(c, StateError,
                  loss_of(model, x.narrow(0, pg.rank() * kShard, kShard),
                          y.narrow(0, pg.rank() * kShard, kShard))
                      .backward(),
                  "Expected to mark a variable ready only once", "block.", "static_graph = true");
  });
}

TEST_CASE("static_graph: a graph that changes after the first iteration is refused by name",
          "[ddp][static_graph]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    auto net = twice(7, false);
    ddp::DistributedDataParallel model(net, borrow(pg), {.static_graph = true});
    auto [x, y] = batch(2, 0);
    Tensor mine = x.narrow(0, pg.rank() * kShard, kShard),
           my_y = y.narrow(0, pg.rank() * kShard, kShard);
    loss_of(model, mine, my_y).backward();  // counted: block's hooks fire once
    loss_of(model, mine, my_y).backward();
    net->checkpointed = true;  // now twice
    EXPECT_THROWS(c, StateError, loss_of(model, mine, my_y).backward(), "static_graph",
                  "parameter block.", "fired more than the 1 time(s)");
  });
}

TEST_CASE("an evaluation forward between a forward and its backward changes nothing",
          "[ddp][static_graph]") {
  // static_graph (with a parameter whose hook fires twice), and find_unused_parameters (with
  // the unused `spare`): the evaluation must not touch the pending iteration.
  for (bool static_graph : {true, false})
    run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
      auto net = twice(7, static_graph);
      ddp::DistributedDataParallel model(
          net, borrow(pg), {.find_unused_parameters = !static_graph, .static_graph = static_graph});
      auto reference = twice(7, false);
      for (int step = 0; step < 3; ++step) {
        auto [x, y] = batch(2, step);
        net->zero_grad();
        reference->zero_grad();
        Tensor loss = loss_of(model, x.narrow(0, pg.rank() * kShard, kShard),
                              y.narrow(0, pg.rank() * kShard, kShard));
        {
          autograd::NoGradGuard no_grad;  // not counted, not reduced
          (void)model.forward(x);
        }
        loss.backward();
        loss_of(*reference, x, y).backward();
        EXPECT(c, allclose(net->block->parameters()[0].grad(),
                           reference->block->parameters()[0].grad(), 1e-10, 1e-12));
        EXPECT(c, !net->spare->parameters()[0].grad().defined());
      }
    });
}

TEST_CASE("static_graph: a second backward through one forward is refused by name",
          "[ddp][static_graph]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(twice(7, false), borrow(pg), {.static_graph = true});
    auto [x, y] = batch(2, 0);
    Tensor mine = x.narrow(0, pg.rank() * kShard, kShard),
           my_y = y.narrow(0, pg.rank() * kShard, kShard);
    for (int iteration = 0; iteration < 2; ++iteration) {  // the counting one, then a counted one
      Tensor loss = loss_of(model, mine, my_y);
      loss.backward(Tensor(), /*retain_graph=*/true);
      EXPECT_THROWS(c, StateError, loss.backward(), "static_graph",
                    "fired more than the 1 time(s)");
    }
  });
}

TEST_CASE("static_graph is refused inside a Join, on every rank", "[ddp][static_graph]") {
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(twice(7, false), borrow(pg), {.static_graph = true});
    EXPECT_THROWS(c, InvalidArgumentError, dist::Join join({&model}),
                  "static_graph is not supported inside a Join");
    (void)model.forward(ones({2, 8}, kFloat64));  // not joined: trains as before
  });
}
