#include "nn/transformer.h"

#include "core/ops.h"
#include "nn/activation.h"
#include "nn/linear.h"

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
  const Tensor h = ln_1->forward(x);
  Tensor y =
      x + residual_dropout_->forward(attn->forward(h, h, h, {}, false, {}, true, true).first);
  return y + residual_dropout_->forward(mlp->forward(ln_2->forward(y)));
}

}  // namespace gw::nn
