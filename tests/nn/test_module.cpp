// Module: registration, traversal order and names, modes, gradients, state_dict, files, repr.
#include <catch2/catch.hpp>

#include "nn_test_util.h"

using gw::Tensor;
using namespace gw::nn;

namespace {

// A module with its own parameter and buffer registered *after* a child, so the tests can see
// that own tensors still come first (as in PyTorch).
struct Block : Module {
  std::shared_ptr<Linear> fc;
  Tensor scale;
  Tensor running;
  Block(int64_t n, gw::Generator& gen) : Module("Block") {
    fc = register_module("fc", std::make_shared<Linear>(n, n, gen));
    scale = register_parameter("scale", gw::ones({n}));
    running = register_buffer("running", gw::zeros({n}));
  }
  Tensor forward(const Tensor& x) override { return fc->forward(x) * scale; }
};

struct Net : Module {
  std::shared_ptr<Linear> fc1;
  std::shared_ptr<Block> block;
  std::shared_ptr<Sequential> head;
  explicit Net(gw::Generator& gen) : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<Linear>(3, 4, gen));
    block = register_module("block", std::make_shared<Block>(4, gen));
    head = register_module(
        "head",
        std::make_shared<Sequential>(std::make_shared<ReLU>(), std::make_shared<Dropout>(0.5, gen),
                                     std::make_shared<Linear>(4, 2, false, gen)));
  }
  Tensor forward(const Tensor& x) override {
    return head->forward(block->forward(fc1->forward(x)));
  }
};

// A module that exposes the protected registration calls to the tests.
struct Open : Module {
  Open() : Module("Open") {}
  using Module::register_buffer;
  using Module::register_module;
  using Module::register_parameter;
  using Module::set_tensor;
};

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

std::vector<std::string> keys(const gw::NamedTensors& state) {
  std::vector<std::string> out;
  for (const auto& [k, v] : state) out.push_back(k);
  return out;
}

}  // namespace

TEST_CASE("a bare Module has no forward", "[nn][module]") {
  Module m;
  CHECK_THROWS_AS(m.forward(gw::Tensor()), gw::StateError);
}

TEST_CASE("parameters come depth-first, own tensors before children, with dotted names",
          "[nn][module]") {
  gw::Generator gen(1);
  Net net(gen);
  std::vector<std::string> expected = {"fc1.weight",      "fc1.bias",      "block.scale",
                                       "block.fc.weight", "block.fc.bias", "head.2.weight"};
  CHECK(names(net.named_parameters()) == expected);

  std::vector<Tensor> params = net.parameters();
  REQUIRE(params.size() == 6);
  CHECK(params[0].same(net.fc1->weight));
  CHECK(params[1].same(net.fc1->bias));
  CHECK(params[2].same(net.block->scale));
  CHECK(params[3].same(net.block->fc->weight));
  CHECK(params[5].same(net.head->at<Linear>(2)->weight));
  for (const Tensor& p : params) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }

  CHECK(net.parameters(false).empty());
  CHECK(names(net.block->named_parameters(false)) == std::vector<std::string>{"scale"});
  CHECK(names(net.named_buffers()) == std::vector<std::string>{"block.running"});
  CHECK_FALSE(net.buffers()[0].requires_grad());

  auto children = net.named_children();
  REQUIRE(children.size() == 3);
  CHECK(children[0].first == "fc1");
  CHECK(children[2].first == "head");
  CHECK(net.children()[1].get() == net.block.get());
}

TEST_CASE("a module registered twice contributes its parameters once", "[nn][module]") {
  gw::Generator gen(2);
  Open m;
  auto shared = std::make_shared<Linear>(2, 2, gen);
  m.register_module("a", shared);
  m.register_module("b", shared);
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  // state_dict keeps both names, as PyTorch's does.
  CHECK(keys(m.state_dict()) ==
        std::vector<std::string>{"a.bias", "a.weight", "b.bias", "b.weight"});
}

TEST_CASE("registration rejects bad and duplicate names", "[nn][module]") {
  Open m;
  m.register_parameter("w", gw::zeros({2}));
  CHECK_THROWS_AS(m.register_parameter("w", gw::zeros({2})), gw::InvalidArgumentError);
  CHECK_THROWS_AS(m.register_buffer("w", gw::zeros({2})), gw::InvalidArgumentError);
  CHECK_THROWS_AS(m.register_module("w", std::make_shared<ReLU>()), gw::InvalidArgumentError);
  CHECK_THROWS_WITH(m.register_parameter("a.b", gw::zeros({2})),
                    Catch::Contains("a.b") && Catch::Contains("Open"));
  CHECK_THROWS_AS(m.register_parameter("", gw::zeros({2})), gw::InvalidArgumentError);
  CHECK_THROWS_AS(m.register_parameter("u", Tensor()), gw::InvalidArgumentError);
  CHECK_THROWS_AS(m.register_module("c", std::shared_ptr<Module>()), gw::InvalidArgumentError);
}

TEST_CASE("a registered parameter is a leaf that requires grad", "[nn][module]") {
  Open m;
  Tensor x = gw::ones({3}).requires_grad_();
  Tensor derived = x * 2;  // has history
  Tensor p = m.register_parameter("p", derived);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
  CHECK(p.to_vector<float>() == std::vector<float>{2, 2, 2});
  Tensor frozen = m.register_parameter("frozen", gw::ones({2}), false);
  CHECK_FALSE(frozen.requires_grad());
  CHECK(m.parameters().size() == 2);

  // set_tensor swaps the registered tensor and keeps the requires_grad it had.
  m.set_tensor("p", gw::full({3}, 5.0));
  CHECK(m.named_parameters()[0].second.requires_grad());
  CHECK(m.named_parameters()[0].second.to_vector<float>() == std::vector<float>{5, 5, 5});
  CHECK_THROWS_WITH(m.set_tensor("nope", gw::ones({1})), Catch::Contains("nope"));
  CHECK_THROWS_AS(m.set_tensor("p", Tensor()), gw::InvalidArgumentError);
}

TEST_CASE("train and eval reach every submodule", "[nn][module]") {
  gw::Generator gen(3);
  Net net(gen);
  CHECK(net.is_training());
  net.eval();
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(net.block->is_training());
  CHECK_FALSE(net.block->fc->is_training());
  CHECK_FALSE(net.head->at<Dropout>(1)->is_training());
  net.train();
  CHECK(net.head->at<Dropout>(1)->is_training());
  CHECK(net.block->fc->is_training());
  net.block->train(false);  // a subtree alone
  CHECK(net.is_training());
  CHECK_FALSE(net.block->fc->is_training());
}

TEST_CASE("zero_grad clears every parameter's gradient", "[nn][module]") {
  gw::Generator gen(4);
  Net net(gen);
  net.eval();  // no dropout: every parameter gets a gradient
  net.forward(gw::randn({5, 3}, gen)).sum().backward();
  for (const auto& [name, p] : net.named_parameters()) {
    INFO(name);
    CHECK(p.grad().defined());
  }
  net.zero_grad();
  for (const auto& [name, p] : net.named_parameters()) {
    INFO(name);
    CHECK_FALSE(p.grad().defined());
  }
}

TEST_CASE("state_dict holds detached views of parameters and buffers", "[nn][module]") {
  gw::Generator gen(5);
  Net net(gen);
  gw::NamedTensors state = net.state_dict();
  CHECK(keys(state) == std::vector<std::string>{"block.fc.bias", "block.fc.weight", "block.running",
                                                "block.scale", "fc1.bias", "fc1.weight",
                                                "head.2.weight"});
  const Tensor& w = state.at("fc1.weight");
  CHECK_FALSE(w.requires_grad());
  CHECK(w.raw_data() == net.fc1->weight.raw_data());  // a view, not a copy
  CHECK(gw::equal(w, net.fc1->weight.detach()));
}

TEST_CASE("load_state_dict copies values into the existing tensors", "[nn][module]") {
  gw::Generator gen_a(6), gen_b(7);
  Net a(gen_a), b(gen_b);
  REQUIRE_FALSE(gw::equal(a.fc1->weight.detach(), b.fc1->weight.detach()));
  Tensor handle = b.fc1->weight;
  {
    gw::autograd::NoGradGuard no_grad;
    a.block->running.fill_(3.0);
  }
  b.load_state_dict(a.state_dict());
  for (const auto& [name, t] : a.state_dict()) {
    INFO(name);
    CHECK(gw::equal(t, b.state_dict().at(name)));
  }
  CHECK(handle.same(b.fc1->weight));  // same parameter objects, new values
  CHECK(b.fc1->weight.requires_grad());
  CHECK(b.fc1->weight.is_leaf());
  CHECK(b.block->running.to_vector<float>() == std::vector<float>(4, 3.0f));
  // The copy is deep: changing a afterwards does not change b.
  {
    gw::autograd::NoGradGuard no_grad;
    a.fc1->weight.fill_(0.0);
  }
  CHECK_FALSE(gw::equal(a.fc1->weight.detach(), b.fc1->weight.detach()));
  // float64 values are converted to the parameter's dtype.
  gw::NamedTensors state = b.state_dict();
  state["fc1.bias"] = gw::full({4}, 0.25, gw::kFloat64);
  b.load_state_dict(state);
  CHECK(b.fc1->bias.dtype() == gw::kFloat32);
  CHECK(b.fc1->bias.to_vector<float>() == std::vector<float>(4, 0.25f));
}

TEST_CASE("load_state_dict reports missing, unexpected and mis-shaped keys", "[nn][module]") {
  gw::Generator gen(8);
  Net net(gen);
  const gw::NamedTensors good = net.state_dict();
  const Tensor before = net.fc1->weight.detach().clone();

  gw::NamedTensors missing = good;
  missing.erase("block.fc.bias");
  CHECK_THROWS_AS(net.load_state_dict(missing), gw::InvalidArgumentError);
  CHECK_THROWS_WITH(net.load_state_dict(missing), Catch::Contains("missing") &&
                                                      Catch::Contains("\"block.fc.bias\"") &&
                                                      Catch::Contains("Net"));

  gw::NamedTensors unexpected = good;
  unexpected["block.extra"] = gw::zeros({1});
  CHECK_THROWS_WITH(net.load_state_dict(unexpected),
                    Catch::Contains("unexpected") && Catch::Contains("\"block.extra\""));

  gw::NamedTensors shape = good;
  shape["fc1.weight"] = gw::zeros({3, 4});
  CHECK_THROWS_AS(net.load_state_dict(shape), gw::ShapeError);
  CHECK_THROWS_WITH(net.load_state_dict(shape), Catch::Contains("fc1.weight") &&
                                                    Catch::Contains("(3,4)") &&
                                                    Catch::Contains("(4,3)"));
  CHECK_THROWS_AS(net.load_state_dict(shape, /*strict=*/false), gw::ShapeError);

  // A failed load changes nothing, even for keys that were fine.
  gw::NamedTensors partly = good;
  partly["fc1.bias"] = gw::full({4}, 9.0);
  partly.erase("head.2.weight");
  CHECK_THROWS(net.load_state_dict(partly));
  CHECK_FALSE(net.fc1->bias.to_vector<float>() == std::vector<float>(4, 9.0f));

  // Non-strict loads what matches and skips the rest.
  gw::NamedTensors loose = missing;
  loose["fc1.weight"] = gw::zeros({4, 3});
  loose["unrelated"] = gw::ones({7});
  net.load_state_dict(loose, /*strict=*/false);
  CHECK(net.fc1->weight.to_vector<float>() == std::vector<float>(12, 0.0f));
  CHECK_FALSE(gw::equal(net.fc1->weight.detach(), before));
}

TEST_CASE("save and load round-trip a model through a safetensors file", "[nn][module]") {
  gw::Generator gen_a(9), gen_b(10);
  Net a(gen_a), b(gen_b);
  {
    gw::autograd::NoGradGuard no_grad;
    a.block->running.fill_(-1.5);
  }
  nn_test::TempFile file("gw_nn_module");
  a.save(file.path());

  // The file is plain safetensors with the state_dict's names.
  gw::NamedTensors on_disk = gw::load_safetensors(file.path());
  CHECK(keys(on_disk) == keys(a.state_dict()));

  b.load(file.path());
  for (const auto& [name, t] : a.state_dict()) {
    INFO(name);
    CHECK(gw::equal(t, b.state_dict().at(name)));
  }
  Tensor x = gw::randn({2, 3}, gen_a);
  a.eval();
  b.eval();
  CHECK(gw::equal(a.forward(x), b.forward(x)));

  // A file from a different architecture is refused by name.
  gw::Generator gen_c(11);
  Linear other(3, 4, gen_c);
  CHECK_THROWS_WITH(other.load(file.path()),
                    Catch::Contains("unexpected") && Catch::Contains("fc1.weight"));
  CHECK_THROWS_AS(b.load(file.path() + ".does_not_exist"), gw::Error);
}

TEST_CASE("to(dtype) converts parameters and buffers in place", "[nn][module]") {
  gw::Generator gen(12);
  Net net(gen);
  Tensor w = net.fc1->weight;
  std::vector<float> before = w.to_vector<float>();
  net.eval();
  net.forward(gw::randn({2, 3}, gen)).sum().backward();
  net.to(gw::kFloat64);
  for (const auto& [name, t] : net.state_dict()) {
    INFO(name);
    CHECK(t.dtype() == gw::kFloat64);
  }
  CHECK(w.dtype() == gw::kFloat64);  // the old handle sees the conversion
  CHECK(net.block->running.dtype() == gw::kFloat64);
  CHECK(w.requires_grad());
  CHECK_FALSE(w.grad().defined());
  std::vector<double> after = w.to_vector<double>();
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == static_cast<double>(before[i]));
  Tensor y = net.forward(gw::randn({2, 3}, gen, gw::kFloat64));
  CHECK(y.dtype() == gw::kFloat64);
  y.sum().backward();
  CHECK(w.grad().dtype() == gw::kFloat64);
  // Integer or bool parameters would truncate the weights and train nothing (PyTorch refuses).
  CHECK_THROWS_WITH(net.to(gw::kInt64),
                    Catch::Contains("[Module::to]") && Catch::Contains("int64"));
  CHECK(w.dtype() == gw::kFloat64);
}

TEST_CASE("repr prints the module tree like PyTorch", "[nn][module]") {
  gw::Generator gen(13);
  Sequential mlp(std::make_shared<Linear>(784, 256, gen), std::make_shared<ReLU>(),
                 std::make_shared<Linear>(256, 10, false, gen));
  CHECK(mlp.repr() ==
        "Sequential(\n"
        "  (0): Linear(in_features=784, out_features=256, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Linear(in_features=256, out_features=10, bias=False)\n"
        ")");

  struct Nested : Module {
    Nested(gw::Generator& g) : Module("Block") {
      register_module("fc", std::make_shared<Linear>(2, 3, g));
      register_module("seq", std::make_shared<Sequential>(std::make_shared<ReLU>(),
                                                          std::make_shared<Dropout>()));
    }
  };
  CHECK(Nested(gen).repr() ==
        "Block(\n"
        "  (fc): Linear(in_features=2, out_features=3, bias=True)\n"
        "  (seq): Sequential(\n"
        "    (0): ReLU()\n"
        "    (1): Dropout(p=0.5, inplace=False)\n"
        "  )\n"
        ")");
  CHECK(Sequential().repr() == "Sequential()");

  // Each layer's line, as printed by PyTorch 1.13.
  CHECK(Conv2d(1, 4, 3, {.padding = {1, 1}}, gen).repr() ==
        "Conv2d(1, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))");
  CHECK(Conv2d(2, 4, {3, 5}, {.stride = {2, 2}, .dilation = {2, 1}}, false, gen).repr() ==
        "Conv2d(2, 4, kernel_size=(3, 5), stride=(2, 2), dilation=(2, 1), bias=False)");
  CHECK(MaxPool2d(2).repr() ==
        "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  CHECK(MaxPool2d({3, 2}, {.stride = 1, .padding = 1}).repr() ==
        "MaxPool2d(kernel_size=(3, 2), stride=1, padding=1, dilation=1, ceil_mode=False)");
  CHECK(Flatten().repr() == "Flatten(start_dim=1, end_dim=-1)");
  CHECK(Dropout(0.25, gen).repr() == "Dropout(p=0.25, inplace=False)");
  CHECK(LayerNorm(8).repr() == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
  CHECK(LayerNorm({2, 3}, 1e-6, false).repr() ==
        "LayerNorm((2, 3), eps=1e-06, elementwise_affine=False)");
  CHECK(Embedding(10, 3, gen).repr() == "Embedding(10, 3)");
  CHECK(GELU().repr() == "GELU(approximate='none')");
  CHECK(GELU("tanh").repr() == "GELU(approximate='tanh')");
  CHECK(Tanh().repr() == "Tanh()");
  CHECK(Sigmoid().repr() == "Sigmoid()");
}

TEST_CASE("float_repr formats doubles as Python's repr does", "[nn][module]") {
  struct Probe : Module {
    static std::string f(double v) { return float_repr(v); }
  };
  CHECK(Probe::f(0.5) == "0.5");
  CHECK(Probe::f(1e-5) == "1e-05");
  CHECK(Probe::f(1.0) == "1.0");
  CHECK(Probe::f(100.0) == "100.0");
  CHECK(Probe::f(0.1) == "0.1");
  CHECK(Probe::f(0.0001) == "0.0001");
  CHECK(Probe::f(-2.5e-7) == "-2.5e-07");
  CHECK(Probe::f(1e16) == "1e+16");
  CHECK(Probe::f(123456.75) == "123456.75");
  CHECK(Probe::f(0.0) == "0.0");
}

TEST_CASE("Sequential chains its children and indexes them", "[nn][module][sequential]") {
  gw::Generator gen(14);
  auto fc1 = std::make_shared<Linear>(3, 5, gen);
  auto fc2 = std::make_shared<Linear>(5, 2, gen);
  Sequential seq(fc1, std::make_shared<Tanh>(), fc2);
  REQUIRE(seq.size() == 3);
  CHECK(names(seq.named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  Tensor x = gw::randn({4, 3}, gen);
  CHECK(gw::allclose(seq.forward(x), fc2->forward(gw::tanh(fc1->forward(x)))));
  CHECK(gw::allclose(seq(x), seq.forward(x)));

  CHECK(seq[0].get() == fc1.get());
  CHECK(seq.at<Linear>(2).get() == fc2.get());
  CHECK_THROWS_WITH(seq.at<Linear>(1), Catch::Contains("Tanh"));
  CHECK_THROWS_AS(seq[3], gw::IndexError);

  seq.push_back(std::make_shared<Sigmoid>());
  CHECK(seq.named_children()[3].first == "3");
  std::vector<double> y = nn_test::values(seq.forward(x));
  for (double v : y) CHECK((v > 0 && v < 1));

  Sequential from_vector(std::vector<std::shared_ptr<Module>>{std::make_shared<ReLU>()});
  CHECK(from_vector.named_children()[0].first == "0");
  Sequential empty;
  CHECK(gw::equal(empty.forward(x), x));
}

namespace {
struct HookedPass : Module {
  HookedPass() : Module("HookedPass") {}
  Tensor forward(const Tensor& x) override { return x; }
};
}  // namespace

TEST_CASE("forward hooks run around operator(), in order, and may replace input and output",
          "[nn][module]") {
  auto seq =
      std::make_shared<Sequential>(std::make_shared<HookedPass>(), std::make_shared<HookedPass>());
  std::vector<std::string> seen;
  auto inner = seq->children()[1];
  const int64_t pre = inner->register_forward_pre_hook([&](Module&, const Tensor& x) {
    seen.push_back("pre");
    return x * 2.0;  // the input forward gets
  });
  inner->register_forward_hook([&](Module& m, const Tensor& x, const Tensor& y) {
    seen.push_back("post " + m.type_name());
    CHECK(gw::equal(x, y));  // forward saw the replaced input
    return y + 1.0;          // the output the caller gets
  });
  // Sequential calls its children through operator(), so the hooks run inside it.
  CHECK(gw::equal((*seq)(gw::ones({2})), gw::full({2}, 3.0)));
  CHECK(seen == std::vector<std::string>{"pre", "post HookedPass"});
  // As in PyTorch, calling forward() directly skips a module's own hooks.
  CHECK(gw::equal(inner->forward(gw::ones({2})), gw::ones({2})));
  inner->remove_hook(pre);
  inner->remove_hook(pre);  // again: nothing
  CHECK(gw::equal((*inner)(gw::ones({2})), gw::full({2}, 2.0)));
  CHECK_THROWS_WITH(inner->register_forward_hook(nullptr), Catch::Contains("empty"));
}

TEST_CASE("swap_parameter registers another leaf in place of a parameter", "[nn][module]") {
  gw::Generator gen(0);
  auto fc = std::make_shared<Linear>(3, 2, gen);
  const Tensor replacement = gw::zeros({1, 3}).requires_grad_();
  const Tensor old = fc->swap_parameter("weight", replacement);
  CHECK(old.same(fc->weight));  // the member keeps the old tensor
  CHECK(fc->parameters()[0].same(replacement));
  CHECK(fc->state_dict().at("weight").sizes() == gw::Shape({1, 3}));
  CHECK_THROWS_WITH(fc->swap_parameter("nope", replacement), Catch::Contains("no parameter"));
}
