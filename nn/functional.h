// gw::nn::functional — the stateless forms of the layers and the losses, as
// torch.nn.functional. The modules in nn/ hold parameters and call these; everything here is
// differentiable through autograd (dropout through its mask, the losses through gather).
//
//   namespace F = gw::nn::functional;
//   gw::Tensor h = F::relu(F::linear(x, w1, b1));
//   gw::Tensor loss = F::cross_entropy(F::linear(h, w2, b2), labels);  // labels: int64 (N)
//   gw::Tensor per_sample = F::cross_entropy(logits, labels, F::Reduction::kNone);
//
// Argument orders follow torch.nn.functional (embedding(indices, weight), unlike the core
// gw::embedding(weight, indices)). Shapes, dtypes and class indices are checked, and errors
// name the function and the offending values.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "core/ops.h"
#include "core/random.h"

namespace gw::nn::functional {

// How a loss combines its per-element values.
enum class Reduction { kNone, kMean, kSum };

// --- activations (the core ops, re-exported so that F:: reads like PyTorch) -----------------
using gw::gelu;  // gelu(x, approximate = "none" | "tanh")
using gw::log_softmax;
using gw::relu;
using gw::sigmoid;
using gw::softmax;
using gw::tanh;

// Zeroes each element with probability p and scales the rest by 1/(1-p), so the expectation
// is unchanged; the identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);  // default generator

// --- layers ---------------------------------------------------------------------------------
// x (..., in) @ weight (out, in).T + bias (out).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// torch.flatten: dims start_dim..end_dim merged into one.
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
// Rows of weight (num_embeddings, dim) picked by int64/int32 indices of any shape. With
// padding_idx (negative counts from the end), that row is picked as it is but gets no gradient
// (PyTorch's padding_idx: the padding token's vector stays what it was).
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);
// Normalizes over the trailing dims named by normalized_shape (biased variance, as PyTorch),
// then scales by weight and shifts by bias where they are defined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// x (N,C,H,W) or unbatched (C,H,W); weight (O,C,kh,kw); bias (O) or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              const Conv2dOptions& options = {});
// x (N,C,H,W) or (C,H,W); stride {0,0} means the kernel size; padding at most half the kernel.
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                  std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0});

// --- attention ------------------------------------------------------------------------------
// torch.nn.functional.scaled_dot_product_attention: softmax(q kᵀ · scale + mask) v over the last
// two dims, for q (..., L, E), k (..., S, E), v (..., S, Ev) with equal batch dims (e.g. batch,
// heads), giving (..., L, Ev). attn_mask broadcasts to (..., L, S): bool (true: takes part) or
// added to the scores; is_causal lets row i see keys j <= i (not with a mask); scale defaults to
// 1/sqrt(E); dropout_p drops probabilities (always, as PyTorch's: pass 0 to evaluate). A row
// whose every key is masked out gives zeros (as PyTorch 2.5+; softmax alone would give NaN).
// enable_gqa: grouped-query attention (PyTorch 2.5's): key and value may have fewer heads
// (dim -3) than the query, each a divisor of them; query head j reads key head j / (Hq / Hk)
// and value head j / (Hq / Hv), as repeat_interleave makes them (copies of key and value).
//
//   Tensor y = F::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
//
// On the CPU, float32 and float64 (and 16-bit floats through float32) run one fused kernel
// (FlashAttention's online softmax, dropout included): no (L x S) matrix is made, forward or
// backward. On CUDA, bfloat16 and float16 with head dims up to 128 do, without dropout
// (docs/training.md). Elsewhere, and with a float mask that requires grad, it is the composition
// of matmul, softmax and dropout.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    bool enable_gqa = false);

// --- losses ---------------------------------------------------------------------------------
// Mean (or sum) of (input - target)^2; the shapes must be equal.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);
// input: log-probabilities (N,C,d1,...) or (C); target: int64 class indices (N,d1,...) or ().
// The loss of an element is -input[n, target[n]]; kNone returns them in target's shape.
Tensor nll_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);
// nll_loss of log_softmax over the class dim (dim 1, or 0 for an unbatched (C) input).
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     Reduction reduction = Reduction::kMean);

}  // namespace gw::nn::functional
