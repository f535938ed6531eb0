// Join with DDP on uneven inputs, ranks as threads over real Gloo: each iteration's averaged
// gradient equals the single-process gradient on the data its ranks saw, every rank ends with the
// model of an uninterrupted single-process run, and without a Join the others fail in time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/algorithms/join.h"
#include "nn/nn.h"
#include "optim/sgd.h"
#include "tests/dist/process_group/ranks.h"

using namespace gw;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;
using namespace std::chrono_literals;

namespace {
constexpr int64_t kRows = 5;  // samples per batch
constexpr double kLr = 0.1;

// An MLP with a buffer that training forwards change: the sum of the means of the inputs seen
// (a running statistic, as BatchNorm keeps), so that the buffer broadcasts are checked too.
struct Net : nn::Module {
  explicit Net(uint64_t seed) : Module("Net") {
    Generator gen(seed);
    mlp = register_module(
        "mlp", std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(6, 12, true, gen),
                                                std::make_shared<nn::Tanh>(),
                                                std::make_shared<nn::Linear>(12, 3, true, gen)));
    seen = register_buffer("seen", zeros({1}, kFloat64));
  }
  Tensor forward(const Tensor& x) override {
    if (autograd::is_grad_enabled()) {
      autograd::NoGradGuard no_grad;
      seen.add_(x.mean().to(kFloat64));
    }
    return mlp->forward(x);
  }
  std::shared_ptr<nn::Sequential> mlp;
  Tensor seen;
};

std::shared_ptr<Net> mlp(uint64_t seed) { return std::make_shared<Net>(seed); }

// Rank r's batch of iteration i.
std::pair<Tensor, Tensor> batch(int r, int i) {
  Generator gen(500 + static_cast<uint64_t>(100 * r + i));
  return {randn({kRows, 6}, gen), randint(0, 3, {kRows}, gen)};
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

// The single-process run over the same data: in iteration i, one batch made of the batches of
// every rank that still has one; the gradient scaled by (ranks training / world) when DDP divides
// by the initial world size. Each iteration's gradients, and the parameters at the end.
struct Reference {
  std::vector<std::vector<Tensor>> grads;
  std::vector<Tensor> final_params;
  double final_seen = 0;  // the buffer every rank ends with
};

// The lowest rank that trains in iteration i: DDP's source of buffers then.
int authority(const std::vector<int>& batches, int i) {
  int r = 0;
  while (batches[static_cast<size_t>(r)] <= i) ++r;
  return r;
}

Reference single_process(const std::vector<int>& batches, bool divide_by_initial_world_size) {
  auto model = mlp(7);
  optim::SGD opt(model->parameters(), optim::SGD::options(kLr));
  const int world = static_cast<int>(batches.size());
  const int iterations = *std::max_element(batches.begin(), batches.end());
  Reference ref;
  // Each iteration starts from the buffer of the lowest rank training in it, which added the
  // mean of its own batch of the iteration before; at the end every rank takes the buffer of
  // the lowest rank that trained last.
  for (int i = 0; i < iterations; ++i) {
    const int from = authority(batches, i + 1 < iterations ? i + 1 : i);
    ref.final_seen += batch(from, i).first.mean().item<double>();
  }
  for (int i = 0; i < iterations; ++i) {
    std::vector<Tensor> xs, ys;
    for (int r = 0; r < world; ++r)
      if (i < batches[r]) {
        auto [x, y] = batch(r, i);
        xs.push_back(x), ys.push_back(y);
      }
    opt.zero_grad();
    Tensor loss = nn::functional::cross_entropy(model->forward(cat(xs, 0)), cat(ys, 0));
    if (divide_by_initial_world_size) loss = loss * (static_cast<double>(xs.size()) / world);
    loss.backward();
    std::vector<Tensor> g;
    for (const Tensor& p : model->parameters()) g.push_back(p.grad().clone());
    ref.grads.push_back(std::move(g));
    opt.step();
  }
  for (const Tensor& p : model->parameters()) ref.final_params.push_back(p.detach().clone());
  return ref;
}

Net& net_of(ddp::DistributedDataParallel& model) { return static_cast<Net&>(*model.module()); }

bool all_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t k = 0; k < a.size(); ++k)
    if (!allclose(a[k], b[k], 1e-5, 1e-7)) return false;
  return a.size() == b.size();
}

std::vector<Tensor> grads_of(nn::Module& m) {
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad());
  return g;
}
// This rank's `batches` iterations inside `join` (each with an evaluation forward first, which
// the joined ranks shadow without a backward, if `evaluate`), each iteration's gradients checked
// against the reference; then join(), after which every rank holds the reference's final model
// (the ranks that joined early stopped stepping: they take it from a rank that trained last).
void train_and_join(ddp::DistributedDataParallel& model, dist::Join& join, int batches,
                    const Reference& ref, Checks& c, bool evaluate) {
  optim::SGD opt(model.module()->parameters(), optim::SGD::options(kLr));
  const int rank = model.join_process_group()->rank();
  for (int i = 0; i < batches; ++i) {
    auto [x, y] = batch(rank, i);
    if (evaluate) {
      autograd::NoGradGuard no_grad;
      model(x);
    }
    opt.zero_grad();
    nn::functional::cross_entropy(model(x), y).backward();
    EXPECT(c, all_close(grads_of(*model.module()), ref.grads[i]));
    opt.step();
  }
  join.join();
  EXPECT(c, all_close(model.module()->parameters(), ref.final_params));
}
}  // namespace

TEST_CASE("Join: uneven inputs finish with the gradients and model of the data seen", "[join]") {
  // Rank 0 with no data at all joins before the first iteration (whose bucket order then
  // comes from rank 1); in the other run rank 0 joins after two.
  for (const std::vector<int>& batches : {std::vector<int>{2, 5, 4}, std::vector<int>{0, 3, 2}})
    for (bool divide_by_initial : {true, false})
      for (bool find_unused : {false, true}) {
        INFO("batches " << batches[0] << "," << batches[1] << "," << batches[2]
                        << "; divide_by_initial_world_size " << divide_by_initial
                        << "; find_unused_parameters " << find_unused);
        const Reference ref = single_process(batches, divide_by_initial);
        run_ranks(3,
                  [&](dist::ProcessGroupGloo& pg, Checks& c) {
                    ddp::DistributedDataParallel model(
                        mlp(pg.rank() == 0 ? 7 : 40 + pg.rank()), borrow(pg),
                        {.bucket_cap_mb = 1e-4,
                         .first_bucket_cap_mb = 1e-4,  // a bucket per parameter
                         .find_unused_parameters = find_unused});
                    dist::Join join({&model}, {.divide_by_initial_world_size = divide_by_initial});
                    train_and_join(model, join, batches[pg.rank()], ref, c, true);
                    EXPECT(c, std::abs(net_of(model).seen.item<double>() - ref.final_seen) < 1e-9);
                  },
                  {.timeout = 20s});
      }
}

TEST_CASE("Join shadows a comm hook's collectives", "[join]") {
  const std::vector<int> batches{3, 1, 2};
  const Reference ref = single_process(batches, true);  // the hook averages over the world
  run_ranks(3,
            [&](dist::ProcessGroupGloo& pg, Checks& c) {
              ddp::DistributedDataParallel model(mlp(7), borrow(pg));
              int calls = 0;  // the joined ranks run the hook (on zeros) for each shadowed bucket
              model.register_comm_hook([&calls, average = ddp::hooks::allreduce()](
                                           dist::ProcessGroup& group, ddp::GradBucket& bucket) {
                ++calls;
                return average(group, bucket);
              });
              dist::Join join({&model});
              train_and_join(model, join, batches[pg.rank()], ref, c, false);
              EXPECT(c, calls == 3 * static_cast<int>(model.reducer().buckets().size()));
            },
            {.timeout = 20s});
}

TEST_CASE("Join checks its joinables, and DDP's forwards inside it", "[join]") {
  run_ranks(2,
            [&](dist::ProcessGroupGloo& pg, Checks& c) {
              auto model = std::make_unique<ddp::DistributedDataParallel>(mlp(7), borrow(pg));
              EXPECT_THROWS(c, InvalidArgumentError, dist::Join(std::vector<dist::Joinable*>{}),
                            "[Join] no joinable given");
              EXPECT_THROWS(c, InvalidArgumentError, dist::Join({model.get(), nullptr}),
                            "joinable 1 is null");
              EXPECT_THROWS(c, InvalidArgumentError, dist::Join({model.get(), model.get()}),
                            "joinable 1 is given twice");
              {
                dist::Join outer({model.get()});
                EXPECT_THROWS(c, InvalidArgumentError, dist::Join({model.get()}),
                              "is in another Join already");
                // Two training forwards and no backward between them: the joined ranks could not
                // shadow that. Both ranks raise before announcing the second.
                auto [x, y] = batch(pg.rank(), 0);
                Tensor first = model->forward(x);
                EXPECT_THROWS(c, StateError, model->forward(x), "must be followed by its backward");
                nn::functional::cross_entropy(first, y).backward();
                model->forward(x).sum().backward();  // in step again
                outer.join();
              }
              // A joinable may die before its Join: attached (it takes itself off), joined,
              // or in a disabled one.
              {
                auto other = std::make_unique<ddp::DistributedDataParallel>(mlp(7), borrow(pg));
                dist::Join pending({other.get(), model.get()});
                other.reset();
              }
              dist::Join finished({model.get()});
              dist::Join disabled({model.get()}, {.enable = false});
              finished.join();
              model.reset();
            },
            {.timeout = 20s});
}

TEST_CASE("Join with throw_on_early_termination: every rank raises once one has joined", "[join]") {
  const std::vector<int> batches{1, 3, 3};
  run_ranks(3,
            [&](dist::ProcessGroupGloo& pg, Checks& c) {
              ddp::DistributedDataParallel model(mlp(7), borrow(pg));
              dist::Join join({&model}, {.throw_on_early_termination = true});
              int done = 0;
              auto train = [&] {
                for (; done < batches[pg.rank()]; ++done) {
                  auto [x, y] = batch(pg.rank(), done);
                  nn::functional::cross_entropy(model(x), y).backward();
                }
                join.join();
              };
              if (pg.rank() == 0) {
                EXPECT_THROWS(c, StateError, train(), "rank 0 exhausted its inputs");
              } else {
                EXPECT_THROWS(c, StateError, train(), "rank(s) 0 exhausted their inputs");
                EXPECT(c, done == 1);  // the second forward raised
              }
            },
            {.timeout = 20s});
}

TEST_CASE("without Join, a rank that runs out of data makes the others raise in time", "[join]") {
  const std::vector<int> batches{3, 1, 3};
  std::promise<void> others_done;
  std::shared_future<void> done = others_done.get_future().share();
  std::atomic<int> finished{0};
  run_ranks(
      3,
      [&](dist::ProcessGroupGloo& pg, Checks& c) {
        ddp::DistributedDataParallel model(mlp(7), borrow(pg));
        const auto started = std::chrono::steady_clock::now();
        auto train = [&] {
          for (int i = 0; i < batches[pg.rank()]; ++i) {
            auto [x, y] = batch(pg.rank(), i);
            nn::functional::cross_entropy(model(x), y).backward();
          }
        };
        if (pg.rank() == 1) {  // out of data, alive (say, evaluating) until the others are done
          train();
          EXPECT(c, done.wait_for(120s) == std::future_status::ready);
          return;
        }
        EXPECT_THROWS(c, TimeoutError, train(), "timed out");
        EXPECT(c, std::chrono::steady_clock::now() - started < 60s);
        if (++finished == 2) others_done.set_value();
        // Alive until the other one timed out too: leaving would close its connections, and it
        // would see a closed connection instead of its own timeout.
        EXPECT(c, done.wait_for(120s) == std::future_status::ready);
      },
      {.timeout = 3s});
}
