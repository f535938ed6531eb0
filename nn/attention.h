// MultiheadAttention, as torch.nn.MultiheadAttention: queries, keys and values projected by one
// (3E, E) in_proj_weight, split into num_heads heads of E / num_heads, attended
// (functional::scaled_dot_product_attention: the fused kernel on the CPU) and projected back by
// out_proj. Parameter names and layout are PyTorch's, so state dicts load both ways.
//
//   gw::Generator gen(0);
//   auto mha = std::make_shared<gw::nn::MultiheadAttention>(
//       128, 4, gw::nn::MultiheadAttentionOptions{.batch_first = true}, gen);
//   auto [y, weights] = mha->forward(x, x, x, {}, /*need_weights=*/false, {}, true,
//                                    /*is_causal=*/true);       // x (N, L, 128) -> y (N, L, 128)
//
// Masks follow PyTorch's MultiheadAttention, whose bool masks are the opposite of
// scaled_dot_product_attention's: true means "masked out". attn_mask is (L, S) or
// (N * num_heads, L, S); key_padding_mask is (N, S); a float mask is added to the scores.
#pragma once

#include <memory>
#include <utility>

#include "core/random.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace gw::nn {

struct MultiheadAttentionOptions {
  double dropout = 0.0;      // on the attention probabilities, in training mode
  bool bias = true;          // in_proj_bias and out_proj.bias
  bool batch_first = false;  // (N, L, E) instead of (L, N, E)
};

class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& options,
                     Generator& gen);
  // Draws from gw::default_generator().
  MultiheadAttention(int64_t embed_dim, int64_t num_heads,
                     const MultiheadAttentionOptions& options = {});

  // (output, weights): output in query's layout; weights (N, L, S), averaged over the heads
  // unless !average_attn_weights ((N, num_heads, L, S)), undefined unless need_weights; they
  // are the probabilities after dropout, as PyTorch's. As in PyTorch, need_weights defaults to
  // true; pass false for the fused kernel (the weights need the full (L x S) matrix). A row
  // whose every key is masked gives zeros on both paths. is_causal without attn_mask lets row
  // i see keys j <= i (PyTorch 2 asks for the mask too); with attn_mask, the mask decides.
  std::pair<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& key_padding_mask = {}, bool need_weights = true,
                                    const Tensor& attn_mask = {}, bool average_attn_weights = true,
                                    bool is_causal = false);
  // Self-attention without masks or weights: x -> output (so that it fits in a Sequential).
  Tensor forward(const Tensor& x) override;
  // PyTorch's init: in_proj_weight xavier_uniform_, the biases zero, out_proj.weight as Linear.
  void reset_parameters(Generator& gen);

  const int64_t embed_dim, num_heads, head_dim;
  const MultiheadAttentionOptions options;
  Tensor in_proj_weight;  // (3 * embed_dim, embed_dim): the q, k and v projections stacked
  Tensor in_proj_bias;    // (3 * embed_dim), undefined without bias
  std::shared_ptr<Linear> out_proj;

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
