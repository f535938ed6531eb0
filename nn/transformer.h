// The pieces of a GPT: GPTBlock, one pre-LayerNorm transformer decoder block, as GPT-2 and nanoGPT
// build it:
//
//   x = x + dropout(attn(ln_1(x)))   causal multi-head self-attention (the fused kernel)
//   x = x + dropout(mlp(ln_2(x)))    Linear(E, 4E) -> GELU -> Linear(4E, E)
//
//   gw::Generator gen(0);
//   auto block = std::make_shared<gw::nn::GPTBlock>(128, 4, gw::nn::GPTBlockOptions{}, gen);
//   gw::Tensor y = block->forward(x);  // x (N, L, 128) -> (N, L, 128)
//
// Children are named ln_1, attn (a MultiheadAttention, batch first), ln_2 and mlp (a Sequential:
// mlp.0, mlp.1, mlp.2), so a PyTorch module with the same names loads its state dict.
//
// GPT: a decoder-only language model built of them, as GPT-2 and nanoGPT are: token and
// position embeddings, `layers` blocks, a final LayerNorm and an output head that shares the
// token embedding (weight tying):
//
//   gw::nn::GPT model({.vocab_size = 65, .context = 128, .layers = 4, .heads = 4, .width = 128},
//                     gen);
//   gw::Tensor loss = model.loss(x, y);  // x, y: (N, L) int64, y the next token of each x
//   std::vector<int64_t> text = model.generate(prompt, 200, gen, {.temperature = 0.8});
#pragma once

#include <memory>
#include <vector>

#include "core/random.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"

namespace gw::nn {

struct GPTBlockOptions {
  int64_t mlp_ratio = 4;  // the MLP's hidden width, in multiples of embed_dim
  double dropout = 0.0;   // on the attention probabilities and after each branch, in training
  bool bias = true;       // in the projections and the MLP
};

class GPTBlock : public Module {
 public:
  GPTBlock(int64_t embed_dim, int64_t num_heads, const GPTBlockOptions& options, Generator& gen);
  // Draws from gw::default_generator().
  GPTBlock(int64_t embed_dim, int64_t num_heads, const GPTBlockOptions& options = {});

  // x (N, L, E) -> (N, L, E); row i attends to rows j <= i.
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiheadAttention> attn;
  std::shared_ptr<Sequential> mlp;

 private:
  std::shared_ptr<Dropout> residual_dropout_;
};

struct GPTOptions {
  int64_t vocab_size = 0;   // tokens are 0 ... vocab_size - 1
  int64_t context = 128;    // the longest sequence: positions 0 ... context - 1 are embedded
  int64_t layers = 4;       // blocks
  int64_t heads = 4;        // attention heads per block; width must be a multiple
  int64_t width = 128;      // the embedding dimension E
  double dropout = 0.0;     // after the embeddings and in every block, in training
  bool bias = true;         // in the blocks' projections and MLPs (the head has none)
  bool tie_weights = true;  // lm_head.weight is wte.weight
  // Each block's activations recomputed in backward rather than kept (autograd::checkpoint, its
  // dropout masks drawn again alike): a block's input is all a block keeps, for a third more
  // compute. Not in GPT::stage's pipeline stages (which refuse it).
  bool checkpoint_activations = false;
};

struct SamplingOptions {
  double temperature = 1.0;  // the logits are divided by it: below 1, surer; above, more varied
  int64_t top_k = 0;         // sample among the k most likely tokens only (0: all)
};

class GPT : public Module {
 public:
  // The model's Dropout modules draw from `gen`, which must then outlive the model when
  // options.dropout > 0.
  GPT(const GPTOptions& options, Generator& gen);
  // Draws from gw::default_generator().
  explicit GPT(const GPTOptions& options);

  // tokens (N, L) int64 with L <= context -> logits (N, L, vocab_size); row i of a sequence
  // sees tokens 0 ... i.
  Tensor forward(const Tensor& tokens) override;
  // The mean cross-entropy of predicting targets (N, L) int64 from tokens (N, L).
  Tensor loss(const Tensor& tokens, const Tensor& targets);
  // GPT-2's init: Linear and Embedding weights N(0, 0.02), biases zero, LayerNorms one and
  // zero, and the projections that end a residual branch (attn.out_proj, mlp.2) N(0, 0.02 /
  // sqrt(2 layers)), so the residual stream's variance does not grow with depth.
  void reset_parameters(Generator& gen);
  // `prompt` (non-empty tokens) followed by `count` more, each drawn from the model's
  // prediction given the last `context` tokens before it. Runs in eval mode without gradients
  // (the mode is restored after).
  std::vector<int64_t> generate(std::vector<int64_t> prompt, int64_t count, Generator& gen,
                                const SamplingOptions& sampling = {});
  // The part of the model that stage `index` of `count` runs in a pipeline
  // (pipeline/schedule.h), sharing this model's parameters: layers / count blocks, with the
  // embeddings before the first and the final norm and head after the last. Stage 0 takes tokens
  // (N, L), the last gives logits. InvalidArgumentError when the blocks do not divide, or when
  // the head is tied to the embedding and would be cut from it.
  std::shared_ptr<Module> stage(int64_t index, int64_t count) const;

  const GPTOptions options;
  std::shared_ptr<Embedding> wte, wpe;  // token and position embeddings
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> h;  // the blocks: h.0 ... h.<layers - 1>, each a GPTBlock
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;  // (vocab_size, width), no bias

 protected:
  std::string extra_repr() const override;

 private:
  Generator* dropout_gen_;  // what the Dropout modules draw from (checkpoint_activations keeps it)
};

}  // namespace gw::nn
