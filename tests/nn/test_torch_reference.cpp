// Three small models against PyTorch 1.13. tests/nn/fixtures/make_reference.py stores fixed
// inputs, the weights (under state_dict names), the outputs, and every loss value and
// gradient; here the same models are built with gradwire, loaded with load_state_dict, and
// each value and gradient must agree to 1e-5 relative to the reference's scale.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <set>

#include "nn_test_util.h"

using gw::Tensor;
using namespace gw::nn;
namespace F = gw::nn::functional;

namespace {

const gw::NamedTensors& fixture() {
  static const gw::NamedTensors tensors =
      gw::load_safetensors(GW_SOURCE_DIR "/tests/nn/fixtures/reference.safetensors");
  return tensors;
}

const Tensor& expected(const std::string& key) {
  INFO("fixture key " << key);
  auto it = fixture().find(key);
  REQUIRE(it != fixture().end());
  return it->second;
}

using LossFn = std::function<Tensor(const Tensor& out, const Tensor& labels, const Tensor& target)>;

// The same table as LOSSES in make_reference.py.
const std::map<std::string, LossFn>& losses() {
  static const std::map<std::string, LossFn> all = {
      {"ce_mean", [](auto& o, auto& l, auto&) { return F::cross_entropy(o, l); }},
      {"ce_sum",
       [](auto& o, auto& l, auto&) { return F::cross_entropy(o, l, F::Reduction::kSum); }},
      {"nll_mean", [](auto& o, auto& l, auto&) { return F::nll_loss(o, l); }},
      {"nll_sum_logsoftmax",
       [](auto& o, auto& l, auto&) {
         return F::nll_loss(F::log_softmax(o, 1), l, F::Reduction::kSum);
       }},
      {"mse_mean", [](auto& o, auto&, auto& t) { return F::mse_loss(o, t); }},
      {"mse_sum", [](auto& o, auto&, auto& t) { return F::mse_loss(o, t, F::Reduction::kSum); }},
  };
  return all;
}

constexpr double kRel = 1e-5;

// Loads "<name>.param.*" into the model and checks its output, then every loss and gradient.
void check_model(const std::string& name, Module& model) {
  gw::NamedTensors state;
  const std::string prefix = name + ".param.";
  for (const auto& [key, t] : fixture()) {
    if (key.rfind(prefix, 0) == 0) state[key.substr(prefix.size())] = t;
  }
  model.load_state_dict(state);  // strict: the names must be PyTorch's

  const Tensor& x = expected(name + ".x");
  const Tensor& labels = expected(name + ".labels");
  const Tensor& target = expected(name + ".target");
  {
    gw::autograd::NoGradGuard no_grad;
    INFO(name << ".output");
    CHECK(nn_test::rel_error(model.forward(x), expected(name + ".output")) <= kRel);
  }
  for (const auto& [loss_name, fn] : losses()) {
    const std::string key = name + "." + loss_name;
    model.zero_grad();
    Tensor xi = x.clone().requires_grad_();
    Tensor loss = fn(model.forward(xi), labels, target);
    loss.backward();
    {
      INFO(key << ".value: " << loss.item<double>() << " vs "
               << expected(key + ".value").item<double>());
      CHECK(nn_test::rel_error(loss, expected(key + ".value")) <= kRel);
    }
    {
      INFO(key << ".grad.input");
      CHECK(nn_test::rel_error(xi.grad(), expected(key + ".grad.input")) <= kRel);
    }
    for (const auto& [pname, p] : model.named_parameters()) {
      INFO(key << ".grad." << pname);
      REQUIRE(p.grad().defined());
      CHECK(nn_test::rel_error(p.grad(), expected(key + ".grad." + pname)) <= kRel);
    }
  }
}

}  // namespace

TEST_CASE("MLP (Linear, ReLU, Linear) matches PyTorch", "[nn][torch]") {
  gw::Generator gen(0);  // the weights are replaced by PyTorch's
  Sequential mlp(std::make_shared<Linear>(6, 8, gen), std::make_shared<ReLU>(),
                 std::make_shared<Linear>(8, 4, gen));
  check_model("mlp", mlp);
}

TEST_CASE("CNN (Conv2d, ReLU, MaxPool2d, Flatten, Linear) matches PyTorch", "[nn][torch]") {
  gw::Generator gen(0);
  Sequential cnn(std::make_shared<Conv2d>(1, 4, 3, gw::Conv2dOptions{.padding = {1, 1}}, gen),
                 std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
                 std::make_shared<Flatten>(), std::make_shared<Linear>(4 * 4 * 4, 3, gen));
  check_model("cnn", cnn);
}

TEST_CASE("LayerNorm over (2,5) with (N,C,d) class losses matches PyTorch", "[nn][torch]") {
  LayerNorm ln({2, 5});
  check_model("ln", ln);
}

TEST_CASE("every loss and model in the fixture is checked", "[nn][torch]") {
  // Keys are <model>.<loss>.value: each model and loss must be one the cases above run.
  const std::set<std::string> models = {"mlp", "cnn", "ln"};
  int values = 0;
  for (const auto& [key, t] : fixture()) {
    const std::string suffix = ".value";
    if (key.size() < suffix.size() ||
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    ++values;
    std::string model = key.substr(0, key.find('.'));
    std::string loss = key.substr(model.size() + 1, key.size() - model.size() - 1 - suffix.size());
    INFO(key);
    CHECK(models.count(model) == 1);
    CHECK(losses().count(loss) == 1);
  }
  CHECK(values == static_cast<int>(models.size() * losses().size()));
}
