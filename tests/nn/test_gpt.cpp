// The GPT model (nn/transformer.h) and weight tying (Module::tie_parameter): a tied head's
// gradient is the sum of both uses, it is one parameter to the optimizer and two names to the
// state dict; causality, the context limit, generation and a short training run.
#include <catch2/catch.hpp>

#include <set>

#include "nn_test_util.h"
#include "optim/adamw.h"

using gw::Tensor;
using nn_test::rel_error;

namespace {

gw::nn::GPTOptions tiny_gpt(bool tie = true) {
  return {.vocab_size = 11, .context = 8, .layers = 2, .heads = 2, .width = 8, .tie_weights = tie};
}

// Random tokens (n, l) in [0, vocab).
Tensor random_tokens(int64_t n, int64_t l, int64_t vocab, gw::Generator& gen) {
  std::vector<int64_t> t(static_cast<size_t>(n * l));
  for (int64_t& x : t) x = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(vocab)));
  return gw::from_vector(t, {n, l});
}

}  // namespace

TEST_CASE("a tied head shares the embedding: one parameter, two names, both uses' gradients",
          "[nn][gpt]") {
  gw::Generator gen(1);
  gw::nn::GPT tied(tiny_gpt(true), gen);
  gw::nn::GPT untied(tiny_gpt(false), gen);
  tied.to(gw::kFloat64);
  untied.to(gw::kFloat64);
  CHECK(tied.lm_head->weight.impl() == tied.wte->weight.impl());
  CHECK(untied.lm_head->weight.impl() != untied.wte->weight.impl());
  CHECK(tied.parameters().size() + 1 == untied.parameters().size());
  const gw::NamedTensors state = tied.state_dict();
  CHECK(state.count("wte.weight") == 1);
  CHECK(state.count("lm_head.weight") == 1);

  // The untied model with the tied one's values in both places: the tied gradient is the sum.
  untied.load_state_dict(state);
  Tensor x = random_tokens(3, 8, 11, gen), y = random_tokens(3, 8, 11, gen);
  tied.loss(x, y).backward();
  untied.loss(x, y).backward();
  CHECK(rel_error(tied.wte->weight.grad(),
                  untied.wte->weight.grad() + untied.lm_head->weight.grad()) < 1e-12);
  CHECK(rel_error(tied.h->at<gw::nn::GPTBlock>(1)->attn->in_proj_weight.grad(),
                  untied.h->at<gw::nn::GPTBlock>(1)->attn->in_proj_weight.grad()) < 1e-12);

  // The optimizer updates it once; listing it twice is refused.
  gw::optim::AdamW opt(tied.parameters(), {.lr = 0.1});
  Tensor before = tied.wte->weight.detach().clone();
  opt.step();
  CHECK(rel_error(tied.lm_head->weight.detach(), tied.wte->weight.detach()) == 0);
  CHECK_FALSE(gw::equal(before, tied.wte->weight.detach()));
  CHECK_THROWS_WITH(gw::optim::AdamW({tied.wte->weight, tied.lm_head->weight}),
                    Catch::Contains("more than once"));

  // Loading a state dict keeps the tie; to() keeps it too.
  tied.load_state_dict(untied.state_dict(), true);
  CHECK(tied.lm_head->weight.impl() == tied.wte->weight.impl());
  tied.to(gw::kFloat32);
  CHECK(tied.lm_head->weight.impl() == tied.wte->weight.impl());
  CHECK(tied.wte->weight.dtype() == gw::kFloat32);
}

TEST_CASE("checkpoint_activations: the same loss and gradients, dropout masks included",
          "[nn][gpt]") {
  // float32 takes the fused attention kernel (its dropout seed from the default generator),
  // float64 the composition (its mask drawn from it); the residual dropout draws from the
  // model's generator. The recomputation must draw every mask again alike.
  for (gw::DType dtype : {gw::kFloat32, gw::kFloat64}) {
    CAPTURE(gw::dtype_name(dtype));
    // `frozen`: the embeddings' weights frozen, so the blocks' input needs no gradient (the
    // blocks then keep their activations: a checkpoint would cut them from the loss).
    auto run = [&](bool checkpointed, bool frozen = false) {
      gw::nn::GPTOptions options = tiny_gpt();
      options.dropout = 0.3;
      options.checkpoint_activations = checkpointed;
      gw::Generator gen(4);
      gw::manual_seed(5);
      gw::nn::GPT model(options, gen);
      model.to(dtype);
      if (frozen)
        for (auto* embedding : {model.wte.get(), model.wpe.get()})
          embedding->weight.requires_grad_(false);
      Tensor x = random_tokens(3, 8, 11, gen), y = random_tokens(3, 8, 11, gen);
      const Tensor loss = model.loss(x, y);
      loss.backward();
      std::vector<Tensor> out{loss.detach()};
      for (const Tensor& p : model.parameters()) out.push_back(p.grad());
      return out;
    };
    const double tolerance = dtype == gw::kFloat64 ? 1e-12 : 1e-5;
    for (bool frozen : {false, true}) {
      CAPTURE(frozen);
      const auto plain = run(false, frozen), checkpointed = run(true, frozen);
      REQUIRE(plain.size() == checkpointed.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        CAPTURE(i);
        CHECK(checkpointed[i].defined() == plain[i].defined());  // frozen: only the embeddings'
        if (plain[i].defined() && checkpointed[i].defined())
          CHECK(rel_error(checkpointed[i], plain[i]) < tolerance);
      }
    }
  }
}

TEST_CASE("tie_parameter refuses a tensor that is not a parameter of the same shape", "[nn][gpt]") {
  gw::Generator gen(2);
  gw::nn::Linear head(8, 11, false, gen);
  gw::nn::Embedding other(12, 8, gen), same(11, 8, gen);
  const Tensor original = head.weight;
  CHECK_THROWS_MATCHES(head.tie_weight(other.weight), gw::ShapeError,
                       Catch::Message("[Linear] tie_parameter(\"weight\"): the tensor is (12,8), "
                                      "the parameter it replaces (11,8)"));
  CHECK_THROWS_WITH(
      head.tie_weight(other.weight.detach() * 2),
      Catch::Contains("a leaf that requires grad (is_leaf true, requires_grad false)"));
  CHECK_THROWS_WITH(head.tie_weight(same.weight.to(gw::kFloat64).detach().requires_grad_()),
                    Catch::Contains("the tensor is float64 on cpu, the parameter it replaces "
                                    "float32 on cpu"));
  // Nothing changed: the member and the registered parameter are the original tensor.
  CHECK(head.weight.impl() == original.impl());
  CHECK(head.named_parameters().at(0).second.impl() == original.impl());
}

TEST_CASE("a tied parameter loads from either of its names, and they must agree", "[nn][gpt]") {
  gw::Generator gen(6);
  gw::nn::GPT model(tiny_gpt(), gen);
  gw::NamedTensors state = model.state_dict();
  for (auto& [name, t] : state) t = t.clone();
  const Tensor wanted = gw::randn({11, 8}, gen);
  // A file that stores the shared tensor once, under either name, loads strictly.
  for (const char* kept : {"wte.weight", "lm_head.weight"}) {
    gw::NamedTensors once = state;
    once.erase(std::string(kept) == "wte.weight" ? "lm_head.weight" : "wte.weight");
    once[kept] = wanted;
    model.load_state_dict(once);
    CHECK(gw::equal(model.wte->weight.detach(), wanted));
    CHECK(model.lm_head->weight.impl() == model.wte->weight.impl());
  }
  // An untied model's state dict (two different matrices) is refused, and nothing is loaded.
  state["lm_head.weight"] = gw::randn({11, 8}, gen);
  state["ln_f.bias"] = gw::ones({8});
  CHECK_THROWS_WITH(model.load_state_dict(state),
                    Catch::Contains("\"wte.weight\" and \"lm_head.weight\" are one tied "
                                    "parameter here, but the state dict holds different values"));
  CHECK(gw::equal(model.wte->weight.detach(), wanted));
  CHECK(gw::equal(model.ln_f->bias.detach(), gw::zeros({8})));
}

TEST_CASE("GPT: causal logits, the context limit, bad options and targets", "[nn][gpt]") {
  gw::Generator gen(3);
  gw::nn::GPT model(tiny_gpt(), gen);
  model.to(gw::kFloat64);
  Tensor x = random_tokens(2, 8, 11, gen);
  Tensor logits = model.forward(x);
  CHECK(gw::shape_str(logits.sizes()) == "(2,8,11)");
  // Changing token 5 changes no logit before position 5, and does change position 5's.
  std::vector<int64_t> t = x.to_vector<int64_t>();
  t[5] = (t[5] + 1) % 11;
  Tensor changed = model.forward(gw::from_vector(t, {2, 8}));
  CHECK(rel_error(changed.slice(1, 0, 5), logits.slice(1, 0, 5)) == 0);
  CHECK(rel_error(changed.slice(1, 5, 6), logits.slice(1, 5, 6)) > 1e-6);

  CHECK_THROWS_MATCHES(model.forward(random_tokens(2, 9, 11, gen)), gw::ShapeError,
                       Catch::Message("[GPT] a sequence of 9 tokens (tokens (2,9)) does not fit "
                                      "the context of 8"));
  CHECK_THROWS_WITH(model.loss(x, random_tokens(2, 7, 11, gen)),
                    Catch::Contains("targets (2,7) must have the tokens' shape (2,8)"));
  CHECK_THROWS_WITH(gw::nn::GPT({.vocab_size = 11, .heads = 3, .width = 8}, gen),
                    Catch::Contains("[GPT] width (8) must be a multiple of heads (3)"));
  CHECK_THROWS_WITH(gw::nn::GPT({.vocab_size = 0}, gen), Catch::Contains("must be positive"));
}

TEST_CASE("GPT: GPT-2's init", "[nn][gpt]") {
  gw::Generator gen(4);
  gw::nn::GPT model({.vocab_size = 50, .context = 64, .layers = 8, .heads = 2, .width = 64}, gen);
  auto stddev = [](const Tensor& t) { return std::sqrt(gw::var(t.detach()).item<double>()); };
  CHECK(stddev(model.wte->weight) == Approx(0.02).epsilon(0.1));
  CHECK(stddev(model.h->at<gw::nn::GPTBlock>(0)->attn->in_proj_weight) ==
        Approx(0.02).epsilon(0.1));
  CHECK(stddev(model.h->at<gw::nn::GPTBlock>(7)->attn->out_proj->weight) ==
        Approx(0.02 / 4).epsilon(0.1));  // 0.02 / sqrt(2 * 8)
  CHECK(gw::equal(model.ln_f->weight.detach(), gw::ones({64})));
  CHECK(gw::equal(model.h->at<gw::nn::GPTBlock>(3)->ln_2->bias.detach(), gw::zeros({64})));
}

TEST_CASE("GPT: generate continues the prompt, reproducibly, and learns a pattern", "[nn][gpt]") {
  gw::Generator gen(5);
  gw::nn::GPT model({.vocab_size = 5, .context = 8, .layers = 1, .heads = 2, .width = 16}, gen);
  // Text 0 1 2 3 4 0 1 2 ...: after a short AdamW run the model predicts it.
  std::vector<int64_t> text(64);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int64_t>(i % 5);
  Tensor x = gw::from_vector(std::vector<int64_t>(text.begin(), text.begin() + 40), {5, 8});
  Tensor y = gw::from_vector(std::vector<int64_t>(text.begin() + 1, text.begin() + 41), {5, 8});
  gw::optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0});
  double first = 0, last = 0;
  for (int step = 0; step < 80; ++step) {
    opt.zero_grad();
    Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.1 * first);

  gw::Generator a(7), b(7);
  std::vector<int64_t> out = model.generate({3}, 20, a, {.temperature = 0.5});
  CHECK(out == model.generate({3}, 20, b, {.temperature = 0.5}));
  REQUIRE(out.size() == 21);
  CHECK(out[0] == 3);
  // top_k 1 is greedy: the pattern, over more than a context's length.
  std::vector<int64_t> greedy = model.generate({3}, 12, a, {.top_k = 1});
  CHECK(greedy == model.generate({3}, 12, b, {.temperature = 1e-3}));
  for (size_t i = 0; i < greedy.size(); ++i) CHECK(greedy[i] == static_cast<int64_t>((3 + i) % 5));
  CHECK(model.is_training());  // restored

  CHECK_THROWS_WITH(model.generate({}, 3, a), Catch::Contains("non-empty prompt"));
  CHECK_THROWS_WITH(model.generate({5}, 3, a), Catch::Contains("prompt token 5 is outside"));
  CHECK_THROWS_WITH(model.generate({1}, 3, a, {.temperature = 0}),
                    Catch::Contains("temperature must be positive"));
  // A diverged model is an error, not a stream of one token; the mode is restored all the same.
  model.ln_f->weight.detach().fill_(std::nan(""));
  CHECK_THROWS_WITH(model.generate({1}, 3, a), Catch::Contains("non-finite logit"));
  CHECK(model.is_training());
}

TEST_CASE("GPT::stage cuts the model into parts that compose to it, sharing its parameters",
          "[nn][gpt]") {
  gw::Generator gen(3);
  gw::nn::GPTOptions options = tiny_gpt(false);
  options.layers = 2;
  gw::nn::GPT model(options, gen);
  const Tensor tokens = gw::randint(0, options.vocab_size, {2, 5}, gen);
  const Tensor whole = model(tokens);
  const Tensor staged = (*model.stage(1, 2))((*model.stage(0, 2))(tokens));
  CHECK(gw::allclose(staged, whole, 1e-6, 1e-6));
  CHECK(model.stage(0, 2)->parameters()[0].same(model.wte->weight));  // shared, not copied
  CHECK_THROWS_WITH(model.stage(0, 3), Catch::Contains("must divide evenly"));
  gw::nn::GPT tied(tiny_gpt(true), gen);
  CHECK_THROWS_WITH(tied.stage(0, 2), Catch::Contains("tie_weights = false"));
  CHECK_NOTHROW(tied.stage(0, 1));
  options.checkpoint_activations = true;
  gw::nn::GPT recomputing(options, gen);
  CHECK_THROWS_WITH(recomputing.stage(0, 2), Catch::Contains("checkpoint_activations = false"));
}
