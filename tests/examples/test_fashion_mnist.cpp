// The Fashion-MNIST reader and loader on the real files, and a short training run.
#include <catch2/catch.hpp>
#include <set>

#include "autograd/autograd.h"
#include "examples/common/fashion_mnist.h"
#include "nn/nn.h"
#include "optim/optim.h"

using gw::Tensor;
namespace data = gw::data;

TEST_CASE("the test split has 10000 normalized images with labels 0..9", "[examples][data]") {
  data::Dataset test = data::load_fashion_mnist(data::Split::Test);
  REQUIRE(test.size() == 10000);
  CHECK(test.images.sizes() == gw::Shape{10000, 784});
  CHECK(gw::min(test.labels).item<int64_t>() == 0);
  CHECK(gw::max(test.labels).item<int64_t>() == 9);
  // Normalized with the training statistics: the test set lands near mean 0, std 1.
  CHECK(std::abs(gw::mean(test.images).item<double>()) < 0.05);
  CHECK(std::abs(gw::std(test.images).item<double>() - 1.0) < 0.05);
  // Every class is present in roughly equal numbers (1000 each in the real split).
  Tensor counts = gw::sum(gw::one_hot(test.labels, 10), {0});
  for (int64_t c : counts.to_vector<int64_t>()) CHECK(c == 1000);
}

TEST_CASE("a missing data directory is a clear error", "[examples][data]") {
  setenv("GW_FASHION_MNIST_DIR", "/nonexistent-gradwire-data", 1);
  CHECK_THROWS_WITH(data::load_fashion_mnist(data::Split::Test),
                    Catch::Contains("[load_fashion_mnist] cannot open"));
  unsetenv("GW_FASHION_MNIST_DIR");
}

TEST_CASE("the loader shuffles by (seed, epoch) and shards disjointly", "[examples][data]") {
  data::Dataset ds{gw::arange(100, gw::kFloat32).reshape({100, 1}), gw::arange(100)};
  auto epoch_order = [&](data::LoaderOptions o, int64_t epoch) {
    data::Loader loader(ds, o);
    std::vector<int64_t> seen;
    for (int64_t b = 0; b < loader.num_batches(); ++b) {
      for (int64_t v : loader.batch(epoch, b).second.to_vector<int64_t>()) seen.push_back(v);
    }
    return seen;
  };
  data::LoaderOptions o{.batch_size = 8, .seed = 7};
  CHECK(epoch_order(o, 0) == epoch_order(o, 0));
  CHECK(epoch_order(o, 0) != epoch_order(o, 1));
  std::vector<int64_t> all = epoch_order(o, 0);
  CHECK(std::set<int64_t>(all.begin(), all.end()).size() == 100);

  std::set<int64_t> union_of_shards;
  size_t total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    data::LoaderOptions r = o;
    r.rank = rank;
    r.world_size = 3;
    std::vector<int64_t> shard = epoch_order(r, 2);
    CHECK(shard.size() == 33);  // 100 / 3, the remainder dropped so ranks step together
    total += shard.size();
    union_of_shards.insert(shard.begin(), shard.end());
  }
  CHECK(union_of_shards.size() == total);  // disjoint
  CHECK_THROWS_AS(data::Loader(ds, {.rank = 3, .world_size = 3}), gw::InvalidArgumentError);
}

TEST_CASE("a short MLP training run lowers the loss and beats chance", "[examples][training]") {
  data::Dataset train = data::load_fashion_mnist(data::Split::Train, 4096);
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Sequential>();
  model->push_back(std::make_shared<gw::nn::Linear>(784, 64, true, gen));
  model->push_back(std::make_shared<gw::nn::ReLU>());
  model->push_back(std::make_shared<gw::nn::Linear>(64, 10, true, gen));
  gw::optim::SGD opt(model->parameters(), gw::optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  data::Loader loader(train, {.batch_size = 64, .seed = 0});
  auto eval_loss = [&] {
    gw::autograd::NoGradGuard no_grad;
    return gw::nn::functional::cross_entropy(model->forward(train.images), train.labels)
        .item<double>();
  };
  const double before = eval_loss();
  for (int64_t b = 0; b < loader.num_batches(); ++b) {
    auto [x, y] = loader.batch(0, b);
    opt.zero_grad();
    gw::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
  }
  const double after = eval_loss();
  CHECK(before > 2.0);          // ~ln(10) for an untrained model
  CHECK(after < 0.7 * before);  // one epoch over 4096 samples must learn something
  gw::autograd::NoGradGuard no_grad;
  double acc = gw::eq(gw::argmax(model->forward(train.images), 1), train.labels)
                   .to(gw::kFloat64).mean().item<double>();
  CHECK(acc > 0.6);
}
