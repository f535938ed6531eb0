// GPTBlock: one pre-LayerNorm transformer decoder block, as GPT-2 and nanoGPT build it:
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
#pragma once

#include <memory>

#include "core/random.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/dropout.h"
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

}  // namespace gw::nn
