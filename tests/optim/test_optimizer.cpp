// The Optimizer base: .grad vs functional step, skipping, zero_grad, in-place updates, the
// state_dict round trip and its checks, and the constructor's checks on the parameter list.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>

#include "optim_test_util.h"

using gw::Tensor;
using namespace gw::optim;
using optim_test::all_configs;
using optim_test::check_close;
using optim_test::clone_params;
using optim_test::fixed_grads;
using optim_test::grad_map;
using optim_test::make_params;

namespace {

// A loss whose gradient differs per element and changes as the parameters move.
Tensor loss_of(const std::vector<Tensor>& p) {
  Tensor a = (p[0] * p[0] * 0.5 - p[0] * 0.3).sum();
  Tensor b = (p[1] - 1.0).pow(2).sum() + (p[1] * p[1] * p[1]).sum() * 0.1;
  return a + b;
}

std::vector<Tensor> snapshot(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("step(grads) gives the same update as step() with .grad", "[optim][functional]") {
  for (const auto& config : all_configs()) {
    INFO(config.label);
    std::vector<Tensor> a = make_params(), b = clone_params(a);
    auto opt_a = make_optimizer(a, config.options);
    auto opt_b = make_optimizer(b, config.options);
    for (int k = 0; k < 3; ++k) {
      opt_a->zero_grad();
      loss_of(a).backward();
      opt_a->step();
      // The distributed optimizer's path: gradients returned, never written to .grad.
      std::vector<Tensor> gb = gw::autograd::grad({loss_of(b)}, b);
      opt_b->step(grad_map(b, gb));
      CHECK_FALSE(b[0].grad().defined());
      for (size_t j = 0; j < a.size(); ++j) {
        check_close(b[j], a[j], 0,
                    "parameter " + std::to_string(j) + " at step " + std::to_string(k + 1));
      }
    }
    // Both runs moved the parameters away from where they started.
    CHECK_FALSE(gw::equal(a[0], make_params()[0]));
  }
}

TEST_CASE("parameters without a gradient are skipped", "[optim][step]") {
  for (const auto& config : all_configs()) {
    INFO(config.label);
    std::vector<Tensor> p = make_params();
    auto before = snapshot(p);
    auto opt = make_optimizer(p, config.options);
    auto sd0 = opt->state_dict();

    p[0].set_grad(fixed_grads(0)[0]);  // p[1] has no .grad
    opt->step();
    CHECK_FALSE(gw::equal(p[0], before[0]));
    CHECK(gw::equal(p[1], before[1]));
    // The skipped parameter's state is untouched (Adagrad creates it up front, at step 0).
    auto sd = opt->state_dict();
    for (const auto& [key, t] : sd) {
      if (!key.starts_with("state.1.")) continue;
      INFO(key);
      REQUIRE(sd0.contains(key));
      CHECK(gw::equal(t, sd0.at(key)));
    }

    // The functional form skips parameters absent from the map.
    auto mid = snapshot(p);
    opt->step(grad_map({p[1]}, {fixed_grads(1)[1]}));
    CHECK(gw::equal(p[0], mid[0]));
    CHECK_FALSE(gw::equal(p[1], mid[1]));
  }
}

TEST_CASE("entries for tensors that are not parameters are ignored", "[optim][step]") {
  std::vector<Tensor> p = make_params();
  Tensor stranger = gw::zeros({7}, gw::kFloat64);
  SGD opt(p, {.lr = 1.0});
  GradMap grads = grad_map(p, fixed_grads(0));
  grads.emplace(stranger, gw::ones({7}, gw::kFloat64));
  opt.step(grads);
  CHECK(gw::equal(stranger, gw::zeros({7}, gw::kFloat64)));
  check_close(p[1], make_params()[1] - fixed_grads(0)[1], 0, "p[1] = p[1] - 1.0 * g");
}

TEST_CASE("zero_grad clears every gradient and a step without gradients changes nothing",
          "[optim][zero_grad]") {
  std::vector<Tensor> p = make_params();
  Adam opt(p, {.lr = 0.1});
  loss_of(p).backward();
  REQUIRE(p[0].grad().defined());
  REQUIRE(p[1].grad().defined());
  opt.zero_grad();
  CHECK_FALSE(p[0].grad().defined());
  CHECK_FALSE(p[1].grad().defined());
  auto before = snapshot(p);
  opt.step();
  CHECK(gw::equal(p[0], before[0]));
  CHECK(gw::equal(p[1], before[1]));
  CHECK(opt.state_dict().size() == 1);  // only "lr": no parameter was stepped
}

TEST_CASE("updates write into the parameter's storage, so views and handles see them",
          "[optim][inplace]") {
  for (const auto& config : all_configs()) {
    INFO(config.label);
    std::vector<Tensor> p = make_params();
    Tensor handle = p[0];                     // what a Module or an RRef holds
    Tensor row = p[0].detach().select(0, 1);  // a view of part of it
    Tensor flat = p[0].detach().view({6});
    void* data = p[0].raw_data();
    Tensor old_row = row.clone();
    auto opt = make_optimizer(p, config.options);
    opt->step(grad_map(p, fixed_grads(0)));
    CHECK(p[0].raw_data() == data);
    CHECK(handle.same(opt->parameters()[0]));
    CHECK(gw::equal(row, p[0].detach().select(0, 1)));
    CHECK(gw::equal(flat, p[0].detach().view({6})));
    CHECK_FALSE(gw::equal(row, old_row));
  }
}

TEST_CASE("updates run with recording off and leave parameters as leaves", "[optim][inplace]") {
  std::vector<Tensor> p = make_params();
  SGD opt(p, {.lr = 0.1, .momentum = 0.9});
  loss_of(p).backward();
  REQUIRE(gw::autograd::is_grad_enabled());
  opt.step();
  CHECK(gw::autograd::is_grad_enabled());  // the guard restored grad mode
  CHECK(p[0].is_leaf());
  CHECK(p[0].requires_grad());
  // The parameters still take part in a new graph.
  opt.zero_grad();
  loss_of(p).backward();
  CHECK(p[0].grad().defined());
}

TEST_CASE("a gradient whose shape differs from its parameter throws before any update",
          "[optim][errors]") {
  std::vector<Tensor> p = make_params();
  auto before = snapshot(p);
  Adam opt(p, {.lr = 0.1});
  GradMap grads = grad_map(p, {fixed_grads(0)[0], gw::ones({3}, gw::kFloat64)});
  try {
    opt.step(grads);
    FAIL("no error for a (3) gradient of a (4) parameter");
  } catch (const gw::ShapeError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("[Adam]"));
    CHECK_THAT(msg, Catch::Contains("parameter 1"));
    CHECK_THAT(msg, Catch::Contains("(3)"));
    CHECK_THAT(msg, Catch::Contains("(4)"));
  }
  // Parameter 0 had a valid gradient but was not updated either, and no state was created.
  CHECK(gw::equal(p[0], before[0]));
  CHECK(gw::equal(p[1], before[1]));
  CHECK(opt.state_dict().size() == 1);
}

TEST_CASE("state_dict names state like torch.optim", "[optim][state_dict]") {
  std::vector<Tensor> p = make_params();
  Adam opt(p, {.lr = 0.01, .amsgrad = true});
  opt.step(grad_map(p, fixed_grads(0)));
  opt.step(grad_map(p, fixed_grads(1)));
  auto sd = opt.state_dict();
  std::set<std::string> keys;
  for (const auto& [k, t] : sd) keys.insert(k);
  std::set<std::string> expected = {"lr"};
  for (const char* i : {"0", "1"}) {
    for (const char* n : {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
      expected.insert(std::string("state.") + i + "." + n);
    }
  }
  CHECK(keys == expected);
  CHECK(sd.at("lr").item<double>() == 0.01);
  CHECK(sd.at("state.1.step").item<double>() == 2.0);
  CHECK(sd.at("state.1.step").dim() == 0);
  CHECK(sd.at("state.0.exp_avg").sizes() == p[0].sizes());
  // exp_avg after two steps from zero: (1 - b1) (b1 g1 + g2), b1 = 0.9.
  check_close(sd.at("state.1.exp_avg"), (fixed_grads(0)[1] * 0.9 + fixed_grads(1)[1]) * (1 - 0.9),
              1e-12, "exp_avg of parameter 1");
}

TEST_CASE("a state_dict is a snapshot: later steps do not change it", "[optim][state_dict]") {
  std::vector<Tensor> p = make_params();
  RMSprop opt(p, {.momentum = 0.9});
  opt.step(grad_map(p, fixed_grads(0)));
  auto sd = opt.state_dict();
  auto copy = sd;
  for (auto& [k, t] : copy) t = t.clone();
  opt.step(grad_map(p, fixed_grads(1)));
  for (const auto& [k, t] : sd) {
    INFO(k);
    CHECK(gw::equal(t, copy.at(k)));
  }
  CHECK_FALSE(
      gw::equal(opt.state_dict().at("state.0.momentum_buffer"), sd.at("state.0.momentum_buffer")));
}

TEST_CASE("a state_dict round trip continues exactly like an uninterrupted run",
          "[optim][state_dict]") {
  for (const auto& config : all_configs()) {
    INFO(config.label);
    std::vector<Tensor> a = make_params();
    auto opt_a = make_optimizer(a, config.options);
    opt_a->set_lr(opt_a->lr() * 0.5);  // lr travels with the state
    opt_a->step(grad_map(a, fixed_grads(0)));
    opt_a->step(grad_map(a, fixed_grads(1)));

    // Saved through safetensors bytes, as a checkpoint would be.
    auto saved = gw::from_safetensors(gw::to_safetensors(opt_a->state_dict()));
    std::vector<Tensor> b = clone_params(a), c = clone_params(a);
    auto opt_b = make_optimizer(b, config.options);
    opt_b->load_state_dict(saved);
    CHECK(opt_b->lr() == opt_a->lr());
    auto opt_c = make_optimizer(c, config.options);  // no state: must diverge
    opt_c->set_lr(opt_a->lr());

    for (int k = 2; k < 5; ++k) {
      opt_a->step(grad_map(a, fixed_grads(k)));
      opt_b->step(grad_map(b, fixed_grads(k)));
      opt_c->step(grad_map(c, fixed_grads(k)));
    }
    for (size_t j = 0; j < a.size(); ++j) {
      check_close(b[j], a[j], 0, "resumed parameter " + std::to_string(j));
    }
    CHECK_FALSE(gw::equal(c[0], a[0]));
  }
}

TEST_CASE("load_state_dict converts state to the parameter's dtype", "[optim][state_dict]") {
  std::vector<Tensor> p64 = make_params();
  Adam opt64(p64, {.lr = 0.01});
  opt64.step(grad_map(p64, fixed_grads(0)));
  std::vector<Tensor> p32;
  for (const Tensor& p : p64) p32.push_back(p.detach().to(gw::kFloat32).requires_grad_());
  Adam opt32(p32, {.lr = 0.01});
  opt32.load_state_dict(opt64.state_dict());
  auto sd = opt32.state_dict();
  CHECK(sd.at("state.0.exp_avg").dtype() == gw::kFloat32);
  CHECK(sd.at("state.0.step").dtype() == gw::kFloat32);
  CHECK(sd.at("state.0.step").item<double>() == 1.0);
  opt32.step(
      grad_map(p32, {fixed_grads(1)[0].to(gw::kFloat32), fixed_grads(1)[1].to(gw::kFloat32)}));
  opt64.step(grad_map(p64, fixed_grads(1)));
  check_close(p32[0], p64[0], 1e-6, "float32 run resumed from float64 state");
}

TEST_CASE("load_state_dict rejects bad dicts, names the key and changes nothing",
          "[optim][state_dict][errors]") {
  std::vector<Tensor> p = make_params();
  Adam opt(p, {.lr = 0.01});
  opt.step(grad_map(p, fixed_grads(0)));
  const auto good = opt.state_dict();

  auto expect = [&](gw::NamedTensors bad, const std::string& key, auto error_tag) {
    using E = decltype(error_tag);
    INFO("key " << key);
    try {
      opt.load_state_dict(bad);
      FAIL("no error");
    } catch (const E& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("\"" + key + "\""));
      CHECK_THAT(std::string(e.what()), Catch::Contains("[Adam] load_state_dict"));
    }
  };

  auto wrong_shape = good;
  wrong_shape["state.0.exp_avg"] = gw::zeros({3, 2}, gw::kFloat64);
  expect(wrong_shape, "state.0.exp_avg", gw::ShapeError("x"));

  auto wrong_step = good;
  wrong_step["state.1.step"] = gw::zeros({2}, gw::kFloat32);
  expect(wrong_step, "state.1.step", gw::ShapeError("x"));
  for (double count : {-1.0, 2.5, std::nan("")}) {  // each would make the next step NaN
    auto bad_count = good;
    bad_count["state.0.step"] = gw::scalar_tensor(count, gw::kFloat32);
    expect(bad_count, "state.0.step", gw::InvalidArgumentError("x"));
  }

  auto unknown = good;
  unknown["state.0.momentum_buffer"] = gw::zeros({2, 3}, gw::kFloat64);
  expect(unknown, "state.0.momentum_buffer", gw::InvalidArgumentError("x"));

  auto out_of_range = good;
  out_of_range["state.2.exp_avg"] = gw::zeros({4}, gw::kFloat64);
  expect(out_of_range, "state.2.exp_avg", gw::IndexError("x"));

  auto malformed = good;
  malformed["momentum"] = gw::zeros({1}, gw::kFloat64);
  expect(malformed, "momentum", gw::InvalidArgumentError("x"));

  auto missing = good;
  missing.erase("state.1.exp_avg_sq");
  expect(missing, "state.1.exp_avg_sq", gw::InvalidArgumentError("x"));

  auto no_lr = good;
  no_lr.erase("lr");
  expect(no_lr, "lr", gw::InvalidArgumentError("x"));

  auto infinite_lr = good;  // what set_lr refuses
  infinite_lr["lr"] = gw::scalar_tensor(INFINITY, gw::kFloat64);
  expect(infinite_lr, "lr", gw::InvalidArgumentError("x"));

  // Prepared and taken apart: once, and only by the optimizer that prepared it.
  Adam other(clone_params(p), {.lr = 0.01});
  auto prepared = opt.prepare_state_dict(good);
  CHECK_THROWS_AS(other.take_state_dict(std::move(prepared)), gw::StateError);
  opt.take_state_dict(std::move(prepared));
  CHECK_THROWS_AS(opt.take_state_dict(std::move(prepared)), gw::StateError);

  // None of the failed loads changed the state: it still continues like a twin.
  std::vector<Tensor> twin = clone_params(p);
  Adam opt_twin(twin, {.lr = 0.01});
  opt_twin.load_state_dict(good);
  opt.step(grad_map(p, fixed_grads(1)));
  opt_twin.step(grad_map(twin, fixed_grads(1)));
  check_close(p[0], twin[0], 0, "after the rejected loads");
}

TEST_CASE("loading a dict without a parameter's state restarts that parameter",
          "[optim][state_dict]") {
  std::vector<Tensor> p = make_params();
  SGD opt(p, {.lr = 0.1, .momentum = 0.9});
  opt.step(grad_map(p, fixed_grads(0)));
  auto sd = opt.state_dict();
  sd.erase("state.1.momentum_buffer");
  opt.load_state_dict(sd);
  auto before = snapshot(p);
  opt.step(grad_map(p, fixed_grads(1)));
  // A fresh buffer is the gradient itself: p1 -= lr * g, while p0 uses its momentum.
  check_close(p[1], before[1] - fixed_grads(1)[1] * 0.1, 1e-15, "restarted parameter 1");
  Tensor buf0 = fixed_grads(0)[0] * 0.9 + fixed_grads(1)[0];
  check_close(p[0], before[0] - buf0 * 0.1, 1e-15, "parameter 0 with its momentum");
}

TEST_CASE("the parameter list is checked", "[optim][errors]") {
  CHECK_THROWS_AS(SGD({}, {.lr = 0.1}), gw::InvalidArgumentError);
  std::vector<Tensor> p = make_params();
  CHECK_THROWS_WITH(SGD({p[0], p[1], p[0]}, {.lr = 0.1}),
                    Catch::Contains("parameter 2") && Catch::Contains("more than once"));
  Tensor non_leaf = p[0] * 2.0;
  CHECK_THROWS_WITH(Adam({p[1], non_leaf}),
                    Catch::Contains("parameter 1") && Catch::Contains("not a leaf"));
  CHECK_THROWS_AS(Adam({gw::zeros({2}, gw::kInt64)}), gw::DTypeError);
  CHECK_THROWS_AS(Adam({Tensor()}), gw::InvalidArgumentError);
}

TEST_CASE("set_lr changes the step and rejects a negative lr", "[optim][lr]") {
  std::vector<Tensor> p = make_params();
  SGD opt(p, SGD::options(0.1));
  CHECK(opt.lr() == 0.1);
  opt.set_lr(0.5);
  opt.step(grad_map(p, fixed_grads(0)));
  check_close(p[0], make_params()[0] - fixed_grads(0)[0] * 0.5, 1e-15, "p - 0.5 g");
  CHECK_THROWS_WITH(opt.set_lr(-1), Catch::Contains("lr") && Catch::Contains("-1"));
  CHECK(opt.lr() == 0.5);
}

TEST_CASE("a gradient of another floating dtype is converted to the parameter's", "[optim][step]") {
  std::vector<Tensor> p = make_params();
  SGD opt(p, {.lr = 0.5});
  // Values exact in float32, so the float64 result is exact too.
  Tensor g32 = gw::from_vector(std::vector<float>{1.0f, -0.5f, 0.25f, 2.0f});
  opt.step(grad_map({p[1]}, {g32}));
  CHECK(p[1].dtype() == gw::kFloat64);
  CHECK(p[1].to_vector<double>() == std::vector<double>{-2.5, 1.25, 0.0, 2.0});
}

TEST_CASE("a step bumps the parameter's version, so a stale graph cannot backpropagate",
          "[optim][inplace]") {
  for (const auto& config : all_configs()) {
    INFO(config.label);
    std::vector<Tensor> p = make_params();
    auto opt = make_optimizer(p, config.options);
    Tensor stale = loss_of(p);  // saves p[0] and p[1] for its backward
    opt->step(grad_map(p, fixed_grads(0)));
    CHECK_THROWS_AS(stale.backward(), gw::StateError);
  }
}
