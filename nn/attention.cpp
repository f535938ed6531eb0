// Attention in nn. scaled_dot_product_attention (nn/functional.h): the checks, the fused kernel
// of the tensors' backend with its derivative (core/cpu/attention_kernels.cpp; on CUDA,
// core/cuda/attention.cu, for bfloat16 and float16 with head dims up to 128), and the
// composition softmax(q kᵀ · scale + mask) v, which runs where the fused kernel does not: where
// the backend has none for the dtype and head dims (CUDA float32 and float64: cuBLAS products
// and the softmax kernel) or for dropout (CUDA), and when a float mask needs its own gradient;
// 16-bit tensors on the CPU go through the float32 kernel. The fused kernel's dropout draws its
// mask from a seed taken from the default generator, as the composition's dropout draws it. Then
// MultiheadAttention (nn/attention.h), the module on top of it.
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include "autograd/functions/common.h"
#include "autograd/grad_mode.h"
#include "core/autocast.h"
#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/random.h"
#include "nn/attention.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// softmax over the last dim, with zeros for a row whose every score is -inf (every key masked),
// as PyTorch 2.5+ gives, where softmax alone would give 0/0.
Tensor masked_softmax(const Tensor& scores) {
  if (scores.size(-1) == 0) return scores;  // no keys: no weights (the output is then zeros)
  Tensor none = eq(amax(scores.detach(), {-1}, true), -kInf);
  return masked_fill(softmax(masked_fill(scores, none, 0.0), -1), none, 0.0);
}

// A bool mask as an additive one of `like`'s dtype: -inf where it hides a key, 0 elsewhere.
// It hides where true (MultiheadAttention's convention) or where false (the functional op's).
Tensor bool_as_additive(const Tensor& mask, bool true_hides, const Tensor& like) {
  const Tensor hidden = full({}, -kInf, TensorOptions(like.dtype()).with_device(like.device()));
  return true_hides ? where(mask, hidden, 0.0) : where(mask, 0.0, hidden);
}

// (L, S): true where key j comes after row i, which causal attention hides.
Tensor key_after_row(int64_t l, int64_t s, Device device) {
  const TensorOptions index = TensorOptions(kInt64).with_device(device);
  return gt(arange(s, index).unsqueeze(0), arange(l, index).unsqueeze(1));
}

}  // namespace
}  // namespace gw::nn

namespace gw::nn::functional {

namespace {

Shape batch_of(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); }

// Each of t's heads (dim -3) `group` times in a row, as repeat_interleave(group, -3) makes them:
// grouped-query attention's keys and values, one per query head.
Tensor repeat_heads(const Tensor& t, int64_t group) {
  Shape expanded = t.sizes(), joined = t.sizes();
  expanded.insert(expanded.end() - 2, group);  // (..., H, group, S, E)
  joined[joined.size() - 3] *= group;
  return t.unsqueeze(t.dim() - 2).expand(expanded).reshape(joined);
}

// t (..., len, dim) as the fused kernel reads it: (B, H, len, dim) with a unit last stride. A
// 4-D tensor is read in place (MultiheadAttention's heads: transposed views of its
// projections); fewer batch dims are added; more are folded into H, through a copy if need be.
Tensor as_heads(const Tensor& t) {
  const Tensor u = t.stride(-1) == 1 ? t : t.contiguous();
  if (u.dim() == 4) return u;
  if (u.dim() < 4) {
    Shape shape(static_cast<size_t>(4 - u.dim()), 1);
    shape.insert(shape.end(), u.sizes().begin(), u.sizes().end());
    return u.view(std::move(shape));
  }
  return u.reshape({1, numel(batch_of(u)), u.size(-2), u.size(-1)});
}

// An uninitialised (B, H, len, dim) tensor laid out as the heads `like`: as (B, len, H, dim),
// transposed, when like is (MultiheadAttention's), so that joining the heads again is a view;
// contiguous otherwise.
Tensor empty_heads_like(const Tensor& like, int64_t len, int64_t dim) {
  const int64_t b = like.size(0), h = like.size(1);
  if (h > 1 && like.size(2) > 1 && like.transpose(1, 2).is_contiguous())
    return empty({b, len, h, dim}, like.options()).transpose(1, 2);
  return empty({b, h, len, dim}, like.options());
}

// A bool mask (true: takes part) as an additive one of q's dtype: 0 or -inf.
Tensor additive(const Tensor& mask, const Tensor& q) {
  if (!mask.defined() || mask.dtype() != kBool) return mask;
  return bool_as_additive(mask, false, q);
}

Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                double dropout_p, bool causal, double scale) {
  if (k.size(-2) == 0) return matmul(matmul(q, k.transpose(-2, -1)), v);  // no key: zeros
  Tensor s = matmul(q, k.transpose(-2, -1));
  if (q.size(-1) > 0) s = s * scale;  // E = 0: the scores are 0 (the default scale is inf)
  if (causal) s = masked_fill(s, key_after_row(q.size(-2), k.size(-2), q.device()), -kInf);
  if (mask.defined()) s = s + mask;
  Tensor p = masked_softmax(s);
  if (dropout_p > 0) p = dropout(p, dropout_p, true);
  return matmul(p, v);
}

// The fused kernel's derivative: the backend recomputes the probabilities from each query
// row's statistics (its maximum score and log-sum of exponentials).
class AttentionBackward final : public autograd::Node {
 public:
  // q, k, v and out as the kernel reads them (B, H, ., .), stats (2, B * H, L); shapes: the
  // inputs' own.
  AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                    const Tensor& out, const Tensor& stats, const AttentionOptions& options,
                    std::array<Shape, 3> shapes)
      : q_(q),
        k_(k),
        v_(v),
        mask_(mask),
        out_(out),
        stats_(stats),
        options_(options),
        shapes_(std::move(shapes)) {}
  std::string name() const override { return "ScaledDotProductAttentionBackward"; }
  void release_variables() override {
    for (auto* t : {&q_, &k_, &v_, &mask_, &out_, &stats_}) t->reset();
  }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    Tensor q = q_.unpack(*this), k = k_.unpack(*this), v = v_.unpack(*this);
    Tensor out = out_.unpack(*this);
    Tensor gq = empty_heads_like(q, q.size(2), q.size(3));
    Tensor gk = empty_heads_like(k, k.size(2), k.size(3));
    Tensor gv = empty_heads_like(v, v.size(2), v.size(3));
    backend_for(q, "scaled_dot_product_attention")
        .attention_backward(as_heads(grads[0].to(q.dtype())), q, k, v,
                            mask_.defined() ? mask_.unpack(*this) : Tensor(), options_, out,
                            stats_.unpack(*this), gq, gk, gv);
    return {gq.reshape(shapes_[0]), gk.reshape(shapes_[1]), gv.reshape(shapes_[2])};
  }

 private:
  autograd::SavedTensor q_, k_, v_, mask_, out_, stats_;
  AttentionOptions options_;
  std::array<Shape, 3> shapes_;
};

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa) {
  constexpr const char* op = "scaled_dot_product_attention";
  if (autocast_lowers({&q, &k, &v, &attn_mask})) {
    return scaled_dot_product_attention(autocast_lower(q), autocast_lower(k), autocast_lower(v),
                                        autocast_lower(attn_mask), dropout_p, is_causal, scale,
                                        enable_gqa);
  }
  auto shapes = [&] {
    return detail::str("query ", shape_str(q.sizes()), ", key ", shape_str(k.sizes()),
                       " and value ", shape_str(v.sizes()));
  };
  if (enable_gqa) {
    GW_CHECK(q.dim() >= 3 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError, "[", op,
             "] enable_gqa expects (..., Hq, L, E) query, (..., Hk, S, E) key and (..., Hv, S, Ev) "
             "value of one rank, got ",
             shapes());
    // As PyTorch's: key and value heads each divide the query's.
    const int64_t hq = q.size(-3), hk = k.size(-3), hv = v.size(-3);
    GW_CHECK(hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0, ShapeError, "[", op,
             "] with enable_gqa the key's and the value's heads (", hk, " and ", hv,
             ") must each divide the query's (", hq, "); got ", shapes());
    // What the repeated tensors would be refused for, said of the tensors given.
    auto others = [](const Tensor& t) {
      Shape s = batch_of(t);
      s.erase(s.end() - 1);
      return s;
    };
    GW_CHECK(others(k) == others(q) && others(v) == others(q), ShapeError, "[", op,
             "] the batch dims differ: ", shapes());
    if (hk != hq || hv != hq) {
      return scaled_dot_product_attention(q, repeat_heads(k, hq / hk), repeat_heads(v, hq / hv),
                                          attn_mask, dropout_p, is_causal, scale);
    }
  }
  GW_CHECK(q.is_floating_point(), DTypeError, "[", op, "] query must be floating point, got ",
           q.dtype());
  GW_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), DTypeError, "[", op,
           "] query, key and value must have one dtype, got ", q.dtype(), ", ", k.dtype(), " and ",
           v.dtype());
  check_same_device(op, {&q, &k, &v, &attn_mask});
  GW_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), ShapeError, "[", op,
           "] expects (..., L, E) query, (..., S, E) key and (..., S, Ev) value of one rank, got ",
           shapes());
  GW_CHECK(batch_of(k) == batch_of(q) && batch_of(v) == batch_of(q), ShapeError, "[", op,
           "] the batch and head dims differ: ", shapes());
  GW_CHECK(k.size(-1) == q.size(-1), ShapeError, "[", op,
           "] query and key must have one head_dim (E), got ", shapes());
  GW_CHECK(v.size(-2) == k.size(-2), ShapeError, "[", op,
           "] key and value must have one sequence length (S), got ", shapes());
  GW_CHECK(dropout_p >= 0 && dropout_p < 1, InvalidArgumentError, "[", op,
           "] dropout_p must be in [0, 1), got ", dropout_p);
  GW_CHECK(!(is_causal && attn_mask.defined()), InvalidArgumentError, "[", op,
           "] takes an attn_mask or is_causal, not both");
  const int64_t l = q.size(-2), s = k.size(-2), e = q.size(-1), ev = v.size(-1);
  Shape scores = batch_of(q);
  scores.insert(scores.end(), {l, s});
  if (attn_mask.defined()) {
    GW_CHECK(attn_mask.dtype() == kBool || attn_mask.dtype() == q.dtype(), DTypeError, "[", op,
             "] attn_mask must be bool or the query's dtype (", q.dtype(), "), got ",
             attn_mask.dtype());
    bool fits = attn_mask.dim() <= q.dim();
    for (int64_t d = 1; fits && d <= attn_mask.dim(); ++d) {
      const int64_t m = attn_mask.size(-d);
      fits = m == 1 || m == scores[scores.size() - static_cast<size_t>(d)];
    }
    GW_CHECK(fits, ShapeError, "[", op, "] attn_mask of shape ", shape_str(attn_mask.sizes()),
             " does not broadcast to the scores' shape ", shape_str(scores), " (", shapes(), ")");
  }
  const double sc = scale.value_or(1 / std::sqrt(static_cast<double>(e)));
  const Tensor mask = additive(attn_mask, q);

  const bool fused = backend_for(q, op).has_fused_attention(q, v, dropout_p > 0) &&
                     !(mask.defined() && detail::recorder_for(mask)) && q.numel() > 0 &&
                     k.numel() > 0 && v.numel() > 0;
  if (!fused) return composed(q, k, v, mask, dropout_p, is_causal, sc);
  AttentionOptions options{.causal = is_causal, .scale = sc, .dropout_p = dropout_p};
  if (dropout_p > 0) {
    Generator& gen = default_generator();
    std::lock_guard lock(gen.mutex());
    options.dropout_seed = gen.next_u64();
  }

  GradRecorder* rec = detail::recorder_for({&q, &k, &v});
  // What the kernel reads and writes, as (B, H, ., .) heads, outside the graph: the node keeps
  // `heads`, the output without its history (no cycle through it); the caller gets a view.
  Tensor qh, kh, vh, mc, out, heads, stats;
  {
    autograd::NoGradGuard no_grad;
    qh = as_heads(q);
    kh = as_heads(k);
    vh = as_heads(v);
    if (mask.defined()) mc = mask.expand(scores);
    heads = empty_heads_like(qh, l, ev);  // as q is laid out: MultiheadAttention joins it freely
    const DType stat = q.element_size() == 2 ? kFloat32 : q.dtype();  // as layer_norm's
    stats = empty({2, numel(batch_of(q)), l}, TensorOptions(stat).with_device(q.device()));
    backend_for(q, op).attention(qh, kh, vh, mc, options, heads, stats);
    Shape out_shape = batch_of(q);
    out_shape.insert(out_shape.end(), {l, ev});
    out = heads.view(std::move(out_shape));
  }
  if (rec) {
    autograd::record<AttentionBackward>({&q, &k, &v}, out, qh, kh, vh, mc, heads, stats, options,
                                        std::array<Shape, 3>{q.sizes(), k.sizes(), v.sizes()});
  }
  return out;
}

}  // namespace gw::nn::functional

namespace gw::nn {

namespace {

// A MultiheadAttention mask (bool: true is masked out; floating: added) as an additive one of
// `like`'s dtype; `name` for the error.
Tensor mha_additive(const Tensor& mask, const Tensor& like, const char* name) {
  if (!mask.defined()) return mask;
  GW_CHECK(mask.dtype() == kBool || mask.is_floating_point(), DTypeError, "[MultiheadAttention] ",
           name, " must be bool or floating point, got ", mask.dtype());
  if (mask.dtype() != kBool) return mask.to(like.dtype());
  return bool_as_additive(mask, true, like);
}

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads,
                                       const MultiheadAttentionOptions& options, Generator& gen)
    : Module("MultiheadAttention"),
      embed_dim(embed_dim),
      num_heads(num_heads),
      head_dim(num_heads > 0 ? embed_dim / num_heads : 0),
      options(options) {
  GW_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, InvalidArgumentError,
           "[MultiheadAttention] embed_dim (", embed_dim, ") must be a positive multiple of ",
           "num_heads (", num_heads, ")");
  GW_CHECK(options.dropout >= 0 && options.dropout < 1, InvalidArgumentError,
           "[MultiheadAttention] dropout must be in [0, 1), got ", options.dropout);
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
  if (options.bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * embed_dim}));
  out_proj = register_module("out_proj",
                             std::make_shared<Linear>(embed_dim, embed_dim, options.bias, gen));
  reset_parameters(gen);
}

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads,
                                       const MultiheadAttentionOptions& options)
    : MultiheadAttention(embed_dim, num_heads, options, default_generator()) {}

void MultiheadAttention::reset_parameters(Generator& gen) {
  init::xavier_uniform_(in_proj_weight, gen);
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  out_proj->reset_parameters(gen);
  if (out_proj->bias.defined()) init::zeros_(out_proj->bias);
}

std::pair<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                      const Tensor& value,
                                                      const Tensor& key_padding_mask,
                                                      bool need_weights, const Tensor& attn_mask,
                                                      bool average_attn_weights, bool is_causal) {
  constexpr const char* op = "MultiheadAttention";
  const bool batched = query.dim() == 3;
  GW_CHECK(
      (query.dim() == 2 || batched) && key.dim() == query.dim() && value.dim() == query.dim() &&
          query.size(-1) == embed_dim && key.size(-1) == embed_dim && value.size(-1) == embed_dim,
      ShapeError, "[", op, "] expects query, key and value of shape ",
      options.batch_first ? "(N, L, E)" : "(L, N, E)", " or (L, E) with E = ", embed_dim, ", got ",
      shape_str(query.sizes()), ", ", shape_str(key.sizes()), " and ", shape_str(value.sizes()));
  // (N, L, E) from here on.
  auto batch_major = [&](const Tensor& t) {
    if (!batched) return t.unsqueeze(0);
    return options.batch_first ? t : t.transpose(0, 1);
  };
  const Tensor q = batch_major(query), k = batch_major(key), v = batch_major(value);
  const int64_t n = q.size(0), l = q.size(1), s = k.size(1);
  GW_CHECK(k.size(0) == n && v.size(0) == n && v.size(1) == s, ShapeError, "[", op,
           "] query, key and value do not agree on the batch or key and value on the length: ",
           shape_str(query.sizes()), ", ", shape_str(key.sizes()), " and ",
           shape_str(value.sizes()));
  // The projections, split into heads: (N, H, len, D).
  auto project = [&](const Tensor& x, int64_t part, int64_t len) {
    const Tensor b =
        in_proj_bias.defined() ? in_proj_bias.narrow(0, part * embed_dim, embed_dim) : Tensor();
    return functional::linear(x, in_proj_weight.narrow(0, part * embed_dim, embed_dim), b)
        .view({n, len, num_heads, head_dim})
        .transpose(1, 2);
  };
  const Tensor qh = project(q, 0, l), kh = project(k, 1, s), vh = project(v, 2, s);

  // One additive mask broadcasting to (N, H, L, S), or none.
  Tensor mask;
  if (attn_mask.defined()) {
    const bool per_head = attn_mask.dim() == 3;
    GW_CHECK((attn_mask.dim() == 2 || (per_head && attn_mask.size(0) == n * num_heads)) &&
                 attn_mask.size(-2) == l && attn_mask.size(-1) == s,
             ShapeError, "[", op, "] attn_mask must be (L, S) = (", l, ", ", s,
             ") or (N * num_heads, L, S) = (", n * num_heads, ", ", l, ", ", s, "), got ",
             shape_str(attn_mask.sizes()));
    mask = mha_additive(attn_mask, q, "attn_mask");
    if (per_head) mask = mask.view({n, num_heads, l, s});
  }
  if (key_padding_mask.defined()) {
    GW_CHECK(key_padding_mask.dim() == (batched ? 2 : 1) && key_padding_mask.size(-1) == s &&
                 (!batched || key_padding_mask.size(0) == n),
             ShapeError, "[", op, "] key_padding_mask must be ", batched ? "(N, S)" : "(S)",
             " with N = ", n, ", S = ", s, ", got ", shape_str(key_padding_mask.sizes()));
    Tensor padding = mha_additive(key_padding_mask, q, "key_padding_mask").view({n, 1, 1, s});
    mask = mask.defined() ? mask + padding : padding;
  }
  const bool causal = is_causal && !attn_mask.defined();
  if (causal && mask.defined())  // with padding: one mask
    mask = masked_fill(mask, key_after_row(l, s, q.device()), -kInf);
  const double dropout_p = is_training() ? options.dropout : 0.0;

  Tensor heads, weights;
  if (need_weights) {  // the probabilities themselves are asked for: the scores in full
    Tensor scores = matmul(qh, kh.transpose(-2, -1)) * (1 / std::sqrt(double(head_dim)));
    if (mask.defined())
      scores = scores + mask;
    else if (causal)
      scores = masked_fill(scores, key_after_row(l, s, q.device()), -kInf);
    // The weights returned are those that multiply v: after dropout, as PyTorch's.
    weights = functional::dropout(masked_softmax(scores), dropout_p, dropout_p > 0);
    heads = matmul(weights, vh);
    if (average_attn_weights) weights = mean(weights, {1});
    if (!batched) weights = weights.squeeze(0);
  } else {
    heads = functional::scaled_dot_product_attention(qh, kh, vh, mask, dropout_p,
                                                     causal && !mask.defined());
  }
  Tensor out = (*out_proj)(heads.transpose(1, 2).reshape({n, l, embed_dim}));
  if (!batched) return {out.squeeze(0), weights};
  return {options.batch_first ? out : out.transpose(0, 1), weights};
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x, {}, false).first; }

std::string MultiheadAttention::extra_repr() const {
  return detail::str("embed_dim=", embed_dim, ", num_heads=", num_heads,
                     ", dropout=", float_repr(options.dropout),
                     ", batch_first=", options.batch_first ? "True" : "False");
}

}  // namespace gw::nn
