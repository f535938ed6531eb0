#include "nn/embedding.h"

#include "autograd/grad_mode.h"
#include "core/ops.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Embedding(num_embeddings, embedding_dim, default_generator()) {}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen)
    : Embedding(num_embeddings, embedding_dim, {}, gen) {}

namespace {
// The options' padding row in [0, rows), after the sizes' check.
std::optional<int64_t> checked_padding(int64_t rows, int64_t dim,
                                       std::optional<int64_t> padding_idx) {
  GW_CHECK(rows >= 0 && dim >= 0, InvalidArgumentError,
           "[Embedding] num_embeddings and embedding_dim must be non-negative, got ", rows, " and ",
           dim);
  if (!padding_idx) return std::nullopt;
  GW_CHECK(*padding_idx >= -rows && *padding_idx < rows, InvalidArgumentError,
           "[Embedding] padding_idx ", *padding_idx, " is out of range for ", rows, " embeddings");
  return *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
}
}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options,
                     Generator& gen)
    : Module("Embedding"),
      num_embeddings(num_embeddings),
      embedding_dim(embedding_dim),
      padding_idx(checked_padding(num_embeddings, embedding_dim, options.padding_idx)) {
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  reset_parameters(gen);
}

void Embedding::reset_parameters(Generator& gen) {
  init::normal_(weight, gen, 0, 1);
  if (padding_idx) {
    autograd::NoGradGuard no_grad;
    weight.select(0, *padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  GW_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, DTypeError,
           "[Embedding] indices must be int64 or int32, got ", indices.dtype());
  return functional::embedding(indices, weight, padding_idx);
}

std::string Embedding::extra_repr() const {
  return detail::str(num_embeddings, ", ", embedding_dim,
                     padding_idx ? detail::str(", padding_idx=", *padding_idx) : "");
}

}  // namespace gw::nn
