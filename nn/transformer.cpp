#include "nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "autograd/activation_checkpoint.h"
#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "nn/activation.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {

GPTBlock::GPTBlock(int64_t embed_dim, int64_t num_heads, const GPTBlockOptions& options,
                   Generator& gen)
    : Module("GPTBlock") {
  GW_CHECK(options.mlp_ratio > 0, InvalidArgumentError,
           "[GPTBlock] mlp_ratio must be positive, got ", options.mlp_ratio);
  const int64_t hidden = options.mlp_ratio * embed_dim;
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(embed_dim));
  attn = register_module(
      "attn", std::make_shared<MultiheadAttention>(
                  embed_dim, num_heads,
                  MultiheadAttentionOptions{
                      .dropout = options.dropout, .bias = options.bias, .batch_first = true},
                  gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(embed_dim));
  mlp = register_module("mlp", std::make_shared<Sequential>(
                                   std::make_shared<Linear>(embed_dim, hidden, options.bias, gen),
                                   std::make_shared<GELU>(),
                                   std::make_shared<Linear>(hidden, embed_dim, options.bias, gen)));
  residual_dropout_ = register_module("dropout", std::make_shared<Dropout>(options.dropout, gen));
}

GPTBlock::GPTBlock(int64_t embed_dim, int64_t num_heads, const GPTBlockOptions& options)
    : GPTBlock(embed_dim, num_heads, options, default_generator()) {}

Tensor GPTBlock::forward(const Tensor& x) {
  GW_CHECK(x.dim() == 3, ShapeError, "[GPTBlock] expects x of shape (N, L, E), got ",
           shape_str(x.sizes()));
  const Tensor h = (*ln_1)(x);
  Tensor y = x + (*residual_dropout_)(attn->forward(h, h, h, {}, false, {}, true, true).first);
  return y + (*residual_dropout_)((*mlp)((*ln_2)(y)));
}

// --- GPT ------------------------------------------------------------------------------------

namespace {

GPTOptions checked(const GPTOptions& o) {
  GW_CHECK(o.vocab_size > 0 && o.context > 0 && o.layers > 0 && o.heads > 0 && o.width > 0,
           InvalidArgumentError,
           "[GPT] vocab_size, context, layers, heads and width must be positive, got ",
           o.vocab_size, ", ", o.context, ", ", o.layers, ", ", o.heads, ", ", o.width);
  GW_CHECK(o.width % o.heads == 0, InvalidArgumentError, "[GPT] width (", o.width,
           ") must be a multiple of heads (", o.heads, ")");
  return o;
}

}  // namespace

GPT::GPT(const GPTOptions& opts, Generator& gen)
    : Module("GPT"), options(checked(opts)), dropout_gen_(&gen) {
  wte = register_module("wte", std::make_shared<Embedding>(options.vocab_size, options.width, gen));
  wpe = register_module("wpe", std::make_shared<Embedding>(options.context, options.width, gen));
  drop = register_module("drop", std::make_shared<Dropout>(options.dropout, gen));
  h = register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < options.layers; ++i) {
    h->push_back(std::make_shared<GPTBlock>(
        options.width, options.heads,
        GPTBlockOptions{.dropout = options.dropout, .bias = options.bias}, gen));
  }
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(options.width));
  lm_head = register_module(
      "lm_head", std::make_shared<Linear>(options.width, options.vocab_size, false, gen));
  if (options.tie_weights) lm_head->tie_weight(wte->weight);
  reset_parameters(gen);
}

GPT::GPT(const GPTOptions& opts) : GPT(opts, default_generator()) {}

void GPT::reset_parameters(Generator& gen) {
  autograd::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(options.layers));
  // In parameters() order, so that the draws come in the order of the module tree.
  auto linear = [&](Linear& l, double std) {
    init::normal_(l.weight, gen, 0, std);
    if (l.bias.defined()) init::zeros_(l.bias);
  };
  auto norm = [](LayerNorm& n) {
    init::ones_(n.weight);
    init::zeros_(n.bias);
  };
  init::normal_(wte->weight, gen, 0, 0.02);
  init::normal_(wpe->weight, gen, 0, 0.02);
  for (size_t i = 0; i < h->size(); ++i) {
    GPTBlock& block = *h->at<GPTBlock>(i);
    norm(*block.ln_1);
    init::normal_(block.attn->in_proj_weight, gen, 0, 0.02);
    if (block.attn->in_proj_bias.defined()) init::zeros_(block.attn->in_proj_bias);
    linear(*block.attn->out_proj, residual_std);  // ends a residual branch
    norm(*block.ln_2);
    linear(*block.mlp->at<Linear>(0), 0.02);
    linear(*block.mlp->at<Linear>(2), residual_std);  // ends a residual branch
  }
  norm(*ln_f);
  if (!options.tie_weights) init::normal_(lm_head->weight, gen, 0, 0.02);
}

Tensor GPT::forward(const Tensor& tokens) {
  GW_CHECK(tokens.dim() == 2, ShapeError, "[GPT] expects tokens of shape (N, L), got ",
           shape_str(tokens.sizes()));
  const int64_t length = tokens.size(1);
  GW_CHECK(length >= 1 && length <= options.context, ShapeError, "[GPT] a sequence of ", length,
           " tokens (tokens ", shape_str(tokens.sizes()), ") does not fit the context of ",
           options.context);
  const Tensor positions = arange(length, TensorOptions(kInt64).with_device(tokens.device()));
  Tensor x = (*drop)((*wte)(tokens) + (*wpe)(positions));
  // A checkpoint connects its blocks' parameters to the loss only through an input that
  // requires grad: with the embeddings frozen, the blocks keep their activations.
  if (!options.checkpoint_activations || !x.requires_grad()) return (*lm_head)((*ln_f)((*h)(x)));
  autograd::CheckpointOptions keep;
  if (options.dropout > 0 && is_training()) keep.generators = {dropout_gen_};  // it draws
  for (const auto& [name, block] : h->named_children())  // through its hooks (fully_shard's)
    x = autograd::checkpoint([m = block.get()](const Tensor& t) { return (*m)(t); }, x, keep);
  return (*lm_head)((*ln_f)(x));
}

namespace {

// A GPT's embeddings (and their dropout) and its head, as modules of their own.
class GPTEmbeddings : public Module {
 public:
  explicit GPTEmbeddings(const GPT& g) : Module("GPTEmbeddings"), context_(g.options.context) {
    wte = register_module("wte", g.wte);
    wpe = register_module("wpe", g.wpe);
    drop = register_module("drop", g.drop);
  }
  Tensor forward(const Tensor& tokens) override {
    GW_CHECK(tokens.dim() == 2 && tokens.size(1) >= 1 && tokens.size(1) <= context_, ShapeError,
             "[GPT] stage 0 expects tokens (N, L) with L in 1..", context_, ", got ",
             shape_str(tokens.sizes()));
    const Tensor positions =
        arange(tokens.size(1), TensorOptions(kInt64).with_device(tokens.device()));
    return (*drop)((*wte)(tokens) + (*wpe)(positions));
  }
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;

 private:
  int64_t context_;
};

class GPTHead : public Module {
 public:
  explicit GPTHead(const GPT& g) : Module("GPTHead") {
    ln_f = register_module("ln_f", g.ln_f);
    lm_head = register_module("lm_head", g.lm_head);
  }
  Tensor forward(const Tensor& x) override { return (*lm_head)((*ln_f)(x)); }
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;
};

}  // namespace

std::shared_ptr<Module> GPT::stage(int64_t index, int64_t count) const {
  GW_CHECK(count >= 1 && index >= 0 && index < count && options.layers % count == 0,
           InvalidArgumentError, "[GPT] stage ", index, " of ", count, ": the ", options.layers,
           " blocks must divide evenly among the stages");
  GW_CHECK(count == 1 || !options.tie_weights, InvalidArgumentError, "[GPT] stage ", index, " of ",
           count,
           ": the head is tied to the token embedding, which a pipeline would cut apart "
           "(build the model with tie_weights = false)");
  GW_CHECK(!options.checkpoint_activations, InvalidArgumentError, "[GPT] stage ", index, " of ",
           count,
           ": a pipeline's stages do not recompute their activations (build the model with "
           "checkpoint_activations = false)");
  auto part = std::make_shared<Sequential>();
  if (index == 0) part->push_back(std::make_shared<GPTEmbeddings>(*this));
  const auto blocks = h->children();
  const int64_t per_stage = options.layers / count;
  for (int64_t b = index * per_stage; b < (index + 1) * per_stage; ++b)
    part->push_back(blocks[static_cast<size_t>(b)]);
  if (index == count - 1) part->push_back(std::make_shared<GPTHead>(*this));
  return part;
}

Tensor GPT::loss(const Tensor& tokens, const Tensor& targets) {
  GW_CHECK(targets.sizes() == tokens.sizes(), ShapeError, "[GPT] loss: targets ",
           shape_str(targets.sizes()), " must have the tokens' shape ", shape_str(tokens.sizes()));
  const Tensor logits = (*this)(tokens);
  return functional::cross_entropy(logits.reshape({-1, options.vocab_size}), targets.reshape({-1}));
}

std::vector<int64_t> GPT::generate(std::vector<int64_t> prompt, int64_t count, Generator& gen,
                                   const SamplingOptions& sampling) {
  GW_CHECK(!prompt.empty() && count >= 0, InvalidArgumentError,
           "[GPT] generate needs a non-empty prompt and count >= 0, got ", prompt.size(),
           " tokens and count ", count);
  GW_CHECK(sampling.temperature > 0 && sampling.top_k >= 0, InvalidArgumentError,
           "[GPT] generate: temperature must be positive and top_k >= 0, got ",
           sampling.temperature, " and ", sampling.top_k);
  for (int64_t t : prompt) {
    GW_CHECK(t >= 0 && t < options.vocab_size, InvalidArgumentError,
             "[GPT] generate: prompt token ", t, " is outside the vocabulary [0, ",
             options.vocab_size, ")");
  }
  // Eval mode (no dropout) while sampling, and the caller's mode back however it ends.
  struct ModeGuard {
    Module& m;
    bool was_training;
    ~ModeGuard() { m.train(was_training); }
  } mode{*this, is_training()};
  eval();
  autograd::NoGradGuard no_grad;
  const Device device = wte->weight.device();
  std::vector<double> probs;
  std::vector<int64_t> candidates;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(prompt.size()), options.context);
    std::vector<int64_t> window(prompt.end() - n, prompt.end());
    const std::vector<double> l = (*this)(from_vector(window, {1, n}, device))
                                      .select(1, n - 1)
                                      .reshape({-1})
                                      .to(kCPU)
                                      .to(kFloat64)
                                      .to_vector<double>();
    for (double v : l) {
      GW_CHECK(std::isfinite(v), StateError, "[GPT] generate: step ", i,
               " predicted a non-finite logit (", v, ")");
    }
    // The candidates: every token, or those whose logit is at least the top_k-th largest (as
    // nanoGPT keeps them, ties included).
    double threshold = -std::numeric_limits<double>::infinity();
    if (sampling.top_k > 0 && sampling.top_k < options.vocab_size) {
      std::vector<double> sorted = l;
      std::nth_element(sorted.begin(), sorted.begin() + (sampling.top_k - 1), sorted.end(),
                       std::greater<>());
      threshold = sorted[static_cast<size_t>(sampling.top_k - 1)];
    }
    candidates.clear();
    for (int64_t t = 0; t < options.vocab_size; ++t) {
      if (l[t] >= threshold) candidates.push_back(t);
    }
    // softmax(logits / temperature) over them, then the token whose slice of [0, sum) holds u.
    const double top = *std::max_element(l.begin(), l.end());
    probs.assign(candidates.size(), 0);
    double sum = 0;
    for (size_t j = 0; j < candidates.size(); ++j) {
      probs[j] = std::exp((l[candidates[j]] - top) / sampling.temperature);
      sum += probs[j];
    }
    double u;
    {
      std::lock_guard lock(gen.mutex());
      u = gen.next_double() * sum;
    }
    size_t pick = 0;  // the most likely token has probability 1 before normalising: sum >= 1
    for (size_t j = 0; j < candidates.size(); ++j) {
      if (probs[j] == 0) continue;
      pick = j;
      if (u < probs[j]) break;
      u -= probs[j];
    }
    prompt.push_back(candidates[pick]);
  }
  return prompt;
}

std::string GPT::extra_repr() const {
  return detail::str("vocab_size=", options.vocab_size, ", context=", options.context,
                     ", tie_weights=", options.tie_weights ? "True" : "False",
                     options.checkpoint_activations ? ", checkpoint_activations=True" : "");
}

}  // namespace gw::nn
