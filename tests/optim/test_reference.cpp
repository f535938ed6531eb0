// Every optimizer against PyTorch 1.13. tests/optim/fixtures/make_reference.py ran three steps of
// torch.optim on fixed parameters and gradients and stored the parameters after each step, with
// the hyperparameters of each case in the file's metadata. Each case is replayed here, through
// .grad and through the functional step, and must match at every step to 1e-6.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "optim_test_util.h"

using gw::Tensor;
using namespace gw::optim;

namespace {

constexpr double kTol = 1e-6;  // relative + absolute, the acceptance bound
constexpr int kSteps = 3;

struct Fixture {
  gw::NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    out.tensors = gw::load_safetensors(GW_SOURCE_DIR "/tests/optim/fixtures/reference.safetensors",
                                       &out.metadata);
    return out;
  }();
  return f;
}

// The cases: metadata entries other than the generator's notes.
std::map<std::string, std::string> cases() {
  std::map<std::string, std::string> out = fixture().metadata;
  out.erase("generator");
  out.erase("torch");
  return out;
}

// Parses "<Optimizer> key=value ..." into the optimizer name and the key/value pairs.
std::string parse_spec(const std::string& spec, std::map<std::string, std::string>& kv) {
  std::istringstream in(spec);
  std::string kind, item;
  in >> kind;
  while (in >> item) {
    size_t eq = item.find('=');
    REQUIRE(eq != std::string::npos);
    kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return kind;
}

// Reads kv[key] (when present) into `field` and removes it, so leftovers reveal options the
// test does not know.
void take(std::map<std::string, std::string>& kv, const std::string& key, double& field) {
  auto it = kv.find(key);
  if (it == kv.end()) return;
  size_t used = 0;
  field = std::stod(it->second, &used);
  REQUIRE(used == it->second.size());
  kv.erase(it);
}
void take(std::map<std::string, std::string>& kv, const std::string& key, bool& field) {
  auto it = kv.find(key);
  if (it == kv.end()) return;
  REQUIRE((it->second == "0" || it->second == "1"));
  field = it->second == "1";
  kv.erase(it);
}
void take(std::map<std::string, std::string>& kv, const std::string& key,
          std::array<double, 2>& field) {
  auto it = kv.find(key);
  if (it == kv.end()) return;
  size_t comma = it->second.find(',');
  REQUIRE(comma != std::string::npos);
  field = {std::stod(it->second.substr(0, comma)), std::stod(it->second.substr(comma + 1))};
  kv.erase(it);
}

template <typename O>
void take_adam(std::map<std::string, std::string>& kv, O& o) {
  take(kv, "lr", o.lr);
  take(kv, "betas", o.betas);
  take(kv, "eps", o.eps);
  take(kv, "weight_decay", o.weight_decay);
  take(kv, "amsgrad", o.amsgrad);
  take(kv, "maximize", o.maximize);
}

// Options start at gradwire's defaults: a case that leaves an option out checks the default.
OptimizerOptions make_options(const std::string& spec) {
  std::map<std::string, std::string> kv;
  std::string kind = parse_spec(spec, kv);
  OptimizerOptions out;
  if (kind == "SGD") {
    SGDOptions o;
    take(kv, "lr", o.lr);
    take(kv, "momentum", o.momentum);
    take(kv, "dampening", o.dampening);
    take(kv, "nesterov", o.nesterov);
    take(kv, "weight_decay", o.weight_decay);
    take(kv, "maximize", o.maximize);
    out = o;
  } else if (kind == "Adam") {
    AdamOptions o;
    take_adam(kv, o);
    out = o;
  } else if (kind == "AdamW") {
    AdamWOptions o;
    take_adam(kv, o);
    out = o;
  } else if (kind == "Adagrad") {
    AdagradOptions o;
    take(kv, "lr", o.lr);
    take(kv, "lr_decay", o.lr_decay);
    take(kv, "weight_decay", o.weight_decay);
    take(kv, "initial_accumulator_value", o.initial_accumulator_value);
    take(kv, "eps", o.eps);
    take(kv, "maximize", o.maximize);
    out = o;
  } else if (kind == "RMSprop") {
    RMSpropOptions o;
    take(kv, "lr", o.lr);
    take(kv, "alpha", o.alpha);
    take(kv, "eps", o.eps);
    take(kv, "weight_decay", o.weight_decay);
    take(kv, "momentum", o.momentum);
    take(kv, "centered", o.centered);
    take(kv, "maximize", o.maximize);
    out = o;
  } else {
    FAIL("unknown optimizer \"" << kind << "\" in the fixture");
  }
  std::string leftover;
  for (const auto& [k, v] : kv) leftover += k + " ";
  INFO("options the test does not know: " << leftover);
  REQUIRE(kv.empty());
  return out;
}

Tensor fixture_tensor(const std::string& key) {
  auto it = fixture().tensors.find(key);
  INFO("fixture key " << key);
  REQUIRE(it != fixture().tensors.end());
  return it->second;
}

}  // namespace

TEST_CASE("the fixture covers every optimizer in float32 and float64", "[optim][reference]") {
  std::set<std::string> seen;
  for (const auto& [name, spec] : cases()) {
    std::string kind = spec.substr(0, spec.find(' '));
    std::string dtype = name.substr(name.size() - 3);
    seen.insert(kind + "/" + dtype);
    INFO(name);
    // Each stored step must move the parameters, or matching it would prove nothing.
    for (int j = 0; j < 2; ++j) {
      Tensor params = fixture_tensor(name + ".p" + std::to_string(j) + ".params");
      REQUIRE(params.size(0) == kSteps + 1);
      CHECK(params.dtype() == (dtype == "f32" ? gw::kFloat32 : gw::kFloat64));
      for (int k = 0; k < kSteps; ++k) CHECK_FALSE(gw::equal(params[k], params[k + 1]));
    }
  }
  for (const char* kind : {"SGD", "Adam", "AdamW", "Adagrad", "RMSprop"}) {
    for (const char* dtype : {"f32", "f64"}) {
      INFO(kind << " " << dtype);
      CHECK(seen.contains(std::string(kind) + "/" + dtype));
    }
  }
}

TEST_CASE("every optimizer matches torch.optim step by step", "[optim][reference]") {
  auto all = cases();
  REQUIRE(all.size() >= 20);
  for (const auto& [name, spec] : all) {
    for (bool functional : {false, true}) {
      INFO("case " << name << ": " << spec << (functional ? " (step(grads))" : " (.grad)"));
      std::vector<Tensor> params, history, grads;
      for (int j = 0; j < 2; ++j) {
        history.push_back(fixture_tensor(name + ".p" + std::to_string(j) + ".params"));
        grads.push_back(fixture_tensor(name + ".p" + std::to_string(j) + ".grads"));
        params.push_back(history[j][0].clone().requires_grad_());
      }
      auto opt = make_optimizer(params, make_options(spec));
      for (int k = 0; k < kSteps; ++k) {
        if (functional) {
          opt->step(optim_test::grad_map(params, {grads[0][k], grads[1][k]}));
        } else {
          for (int j = 0; j < 2; ++j) params[j].set_grad(grads[j][k].clone());
          opt->step();
        }
        for (int j = 0; j < 2; ++j) {
          CHECK(params[j].dtype() == history[j].dtype());
          optim_test::check_close(
              params[j], history[j][k + 1], kTol,
              "parameter " + std::to_string(j) + " after step " + std::to_string(k + 1));
        }
      }
    }
  }
}
