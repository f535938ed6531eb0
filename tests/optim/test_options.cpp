// Options: torch's defaults, rejected hyperparameters (errors name the option and the value),
// make_optimizer, and the StepLR and LambdaLR (warmup_cosine) schedules.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "optim_test_util.h"

using gw::Tensor;
using namespace gw::optim;

namespace {

std::vector<Tensor> params() { return optim_test::make_params(); }

// `make` must throw InvalidArgumentError whose message names the optimizer, option and value.
void expect_invalid(const std::function<void()>& make, const std::string& optimizer,
                    const std::string& option, const std::string& value) {
  INFO(optimizer << " " << option << " = " << value);
  try {
    make();
    FAIL("no error");
  } catch (const gw::InvalidArgumentError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("[" + optimizer + "]"));
    CHECK_THAT(msg, Catch::Contains(option));
    CHECK_THAT(msg, Catch::Contains(value));
  }
}

}  // namespace

TEST_CASE("options default to torch.optim's defaults", "[optim][options]") {
  // torch.optim 1.13 signatures; SGD's lr has no default there ("required").
  SGDOptions sgd;
  CHECK(std::isnan(sgd.lr));
  CHECK(sgd.momentum == 0);
  CHECK(sgd.dampening == 0);
  CHECK_FALSE(sgd.nesterov);
  CHECK(sgd.weight_decay == 0);
  CHECK_FALSE(sgd.maximize);

  AdamOptions adam;
  CHECK(adam.lr == 1e-3);
  CHECK(adam.betas[0] == 0.9);
  CHECK(adam.betas[1] == 0.999);
  CHECK(adam.eps == 1e-8);
  CHECK(adam.weight_decay == 0);
  CHECK_FALSE(adam.amsgrad);

  AdamWOptions adamw;
  CHECK(adamw.lr == 1e-3);
  CHECK(adamw.weight_decay == 1e-2);
  CHECK(adamw.eps == 1e-8);

  AdagradOptions adagrad;
  CHECK(adagrad.lr == 1e-2);
  CHECK(adagrad.lr_decay == 0);
  CHECK(adagrad.initial_accumulator_value == 0);
  CHECK(adagrad.eps == 1e-10);

  RMSpropOptions rms;
  CHECK(rms.lr == 1e-2);
  CHECK(rms.alpha == 0.99);
  CHECK(rms.eps == 1e-8);
  CHECK(rms.momentum == 0);
  CHECK_FALSE(rms.centered);
}

TEST_CASE("SGD requires an lr", "[optim][options]") {
  CHECK_THROWS_WITH(SGD(params(), SGDOptions{.momentum = 0.9}),
                    Catch::Contains("[SGD]") && Catch::Contains("lr is required"));
  CHECK(SGD::options(0.05).lr == 0.05);
  CHECK(Adam::options(0.5).lr == 0.5);
  CHECK(Adam::options(0.5).betas[1] == 0.999);
}

TEST_CASE("invalid hyperparameters throw naming the option and the value", "[optim][options]") {
  expect_invalid([] { SGD(params(), {.lr = -0.1}); }, "SGD", "lr", "-0.1");
  expect_invalid([] { SGD(params(), {.lr = 0.1, .momentum = -0.5}); }, "SGD", "momentum", "-0.5");
  expect_invalid([] { SGD(params(), {.lr = 0.1, .weight_decay = -1}); }, "SGD", "weight_decay",
                 "-1");
  expect_invalid([] { SGD(params(), {.lr = 0.1, .nesterov = true}); }, "SGD", "nesterov",
                 "momentum 0");
  expect_invalid(
      [] { SGD(params(), {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
      "SGD", "nesterov", "dampening 0.1");

  expect_invalid([] { Adam(params(), {.lr = -1e-3}); }, "Adam", "lr", "-0.001");
  expect_invalid([] { Adam(params(), {.betas = {1.0, 0.999}}); }, "Adam", "betas[0]", "1");
  expect_invalid([] { Adam(params(), {.betas = {-0.1, 0.999}}); }, "Adam", "betas[0]", "-0.1");
  expect_invalid([] { Adam(params(), {.betas = {0.9, 1.5}}); }, "Adam", "betas[1]", "1.5");
  expect_invalid([] { Adam(params(), {.eps = -1e-8}); }, "Adam", "eps", "-1e-08");
  expect_invalid([] { Adam(params(), {.weight_decay = -0.25}); }, "Adam", "weight_decay", "-0.25");

  expect_invalid([] { AdamW(params(), {.lr = -2}); }, "AdamW", "lr", "-2");
  expect_invalid([] { AdamW(params(), {.lr = std::numeric_limits<double>::infinity()}); }, "AdamW",
                 "lr", "inf");
  expect_invalid([] { AdamW(params(), {.weight_decay = std::nan("")}); }, "AdamW", "weight_decay",
                 "nan");
  expect_invalid([] { AdamW(params(), {.betas = {0.9, 1.0}}); }, "AdamW", "betas[1]", "1");
  expect_invalid([] { AdamW(params(), {.weight_decay = -0.01}); }, "AdamW", "weight_decay",
                 "-0.01");

  expect_invalid([] { Adagrad(params(), {.lr = -0.5}); }, "Adagrad", "lr", "-0.5");
  expect_invalid([] { Adagrad(params(), {.lr_decay = -0.5}); }, "Adagrad", "lr_decay", "-0.5");
  expect_invalid([] { Adagrad(params(), {.initial_accumulator_value = -3}); }, "Adagrad",
                 "initial_accumulator_value", "-3");
  expect_invalid([] { Adagrad(params(), {.eps = -1}); }, "Adagrad", "eps", "-1");

  expect_invalid([] { RMSprop(params(), {.lr = -0.5}); }, "RMSprop", "lr", "-0.5");
  expect_invalid([] { RMSprop(params(), {.alpha = -0.9}); }, "RMSprop", "alpha", "-0.9");
  expect_invalid([] { RMSprop(params(), {.momentum = -0.9}); }, "RMSprop", "momentum", "-0.9");
  expect_invalid([] { RMSprop(params(), {.eps = -1e-3}); }, "RMSprop", "eps", "-0.001");
  expect_invalid([] { RMSprop(params(), {.weight_decay = -2}); }, "RMSprop", "weight_decay", "-2");

  // NaN compares false with everything: it must not slip through a ">= 0" check.
  expect_invalid([] { Adam(params(), {.lr = std::nan("")}); }, "Adam", "lr", "nan");
}

TEST_CASE("make_optimizer builds the optimizer its options name", "[optim][options]") {
  CHECK(make_optimizer(params(), SGDOptions{.lr = 0.1})->name() == "SGD");
  CHECK(make_optimizer(params(), AdamOptions{})->name() == "Adam");
  CHECK(make_optimizer(params(), AdamWOptions{})->name() == "AdamW");
  CHECK(make_optimizer(params(), AdagradOptions{})->name() == "Adagrad");
  CHECK(make_optimizer(params(), RMSpropOptions{.lr = 0.25})->lr() == 0.25);
  CHECK_THROWS_AS(make_optimizer(params(), AdamOptions{.eps = -1}), gw::InvalidArgumentError);
}

TEST_CASE("StepLR multiplies the lr by gamma every step_size epochs", "[optim][lr_scheduler]") {
  std::vector<Tensor> p = params();
  SGD opt(p, {.lr = 0.8});
  StepLR sched(opt, {.step_size = 2, .gamma = 0.5});
  // Powers of two: exact in binary, so == is the right comparison.
  std::vector<double> expected = {0.8, 0.4, 0.4, 0.2, 0.2, 0.1};
  for (size_t epoch = 1; epoch <= expected.size(); ++epoch) {
    sched.step();
    INFO("epoch " << epoch);
    CHECK(sched.last_epoch() == static_cast<int64_t>(epoch));
    CHECK(opt.lr() == expected[epoch - 1]);
    CHECK(sched.get_last_lr() == opt.lr());
  }
  // The schedule drives the update: a step now moves p by 0.1 * g.
  opt.step(optim_test::grad_map(p, optim_test::fixed_grads(0)));
  optim_test::check_close(p[1], params()[1] - optim_test::fixed_grads(0)[1] * 0.1, 1e-15,
                          "p - 0.1 g");

  CHECK_THROWS_WITH(StepLR(opt, {.step_size = 0}),
                    Catch::Contains("step_size") && Catch::Contains("0"));
  CHECK_THROWS_WITH(StepLR(opt, {.step_size = 3, .gamma = -1}), Catch::Contains("gamma"));
}

TEST_CASE("LambdaLR with warmup_cosine: a linear warm-up, then a cosine to the floor",
          "[optim][lr_scheduler]") {
  std::vector<Tensor> p = params();
  SGD opt(p, {.lr = 0.5});
  LambdaLR sched(opt, warmup_cosine(4, 12, 0.1));
  CHECK(opt.lr() == Approx(0.5 * 0.2));  // factor(0) applied at once: (0 + 1) / (4 + 1)
  std::vector<double> lrs = {opt.lr()};
  for (int i = 0; i < 14; ++i) {
    sched.step();
    lrs.push_back(opt.lr());
  }
  CHECK(sched.last_epoch() == 14);
  for (int i = 0; i < 4; ++i) CHECK(lrs[size_t(i)] == Approx(0.5 * (i + 1) / 5.0));
  CHECK(lrs[4] == Approx(0.5));                      // the top: cos(0)
  CHECK(lrs[8] == Approx(0.5 * (0.1 + 0.9 * 0.5)));  // halfway: cos(pi / 2)
  for (int i = 1; i <= 4; ++i) CHECK(lrs[size_t(i)] > lrs[size_t(i - 1)]);
  for (int i = 5; i <= 12; ++i) CHECK(lrs[size_t(i)] < lrs[size_t(i - 1)]);
  CHECK(lrs[12] == Approx(0.05));  // the floor, and after it
  CHECK(lrs[14] == Approx(0.05));

  // Resumed at step 8 with the base lr, it continues where the first left off.
  SGD resumed_opt(params(), {.lr = lrs[8]});
  LambdaLR resumed(resumed_opt, warmup_cosine(4, 12, 0.1), 8, 0.5);
  CHECK(resumed_opt.lr() == Approx(lrs[8]));
  resumed.step();
  CHECK(resumed.last_epoch() == 9);
  CHECK(resumed_opt.lr() == Approx(lrs[9]));

  CHECK_THROWS_WITH(LambdaLR(resumed_opt, warmup_cosine(4, 12, 0.1), 8),
                    Catch::Contains("needs the base lr"));
  CHECK_THROWS_WITH(warmup_cosine(10, 10), Catch::Contains("warmup_steps < total_steps"));
  CHECK_THROWS_WITH(LambdaLR(opt, [](int64_t) { return -1.0; }), Catch::Contains("factor"));
  LambdaLR failing(opt, [](int64_t step) { return step < 2 ? 1.0 : -1.0; });
  failing.step();
  CHECK_THROWS_WITH(failing.step(), Catch::Contains("at step 2"));
  CHECK(failing.last_epoch() == 1);  // the failed step is not counted
}

TEST_CASE("AdamW parameter groups: each group steps as an AdamW of its own", "[optim][adamw]") {
  // make_params(): a (2, 3) matrix, which weight_decay_groups decays, and a (4) vector, which
  // it does not.
  std::vector<Tensor> p = params();
  std::vector<ParamGroup> groups = weight_decay_groups(p, 0.25);
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].params.size() == 1);
  CHECK(groups[0].params[0].dim() == 2);
  CHECK(groups[0].weight_decay == 0.25);
  REQUIRE(groups[1].params.size() == 1);
  CHECK(groups[1].weight_decay == 0.0);
  AdamW grouped(groups, {.lr = 0.1, .weight_decay = 0.5});
  CHECK(grouped.weight_decay(0) == 0.25);
  CHECK(grouped.weight_decay(1) == 0.0);

  std::vector<Tensor> a = optim_test::clone_params(p), b = optim_test::clone_params(p);
  AdamW matrix({a[0]}, {.lr = 0.1, .weight_decay = 0.25});
  AdamW vector({b[1]}, {.lr = 0.1, .weight_decay = 0.0});
  for (int k = 0; k < 3; ++k) {
    std::vector<Tensor> g = optim_test::fixed_grads(k);
    grouped.step(optim_test::grad_map(p, g));
    matrix.step(optim_test::grad_map({a[0]}, {g[0]}));
    vector.step(optim_test::grad_map({b[1]}, {g[1]}));
  }
  CHECK(gw::equal(p[0], a[0]));
  CHECK(gw::equal(p[1], b[1]));
  CHECK_FALSE(gw::equal(p[0], optim_test::make_params()[0]));  // they did move
  // A group without its own weight decay takes the optimizer's; a negative one is refused.
  std::vector<Tensor> c = params();
  AdamW defaults({ParamGroup{.params = c, .weight_decay = {}}}, {.weight_decay = 0.5});
  CHECK(defaults.weight_decay(1) == 0.5);
  CHECK_THROWS_WITH(AdamW({ParamGroup{.params = params(), .weight_decay = -1.0}}),
                    Catch::Contains("weight_decay"));
}
