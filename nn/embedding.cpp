#include "nn/embedding.h"

#include "core/ops.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace gw::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Embedding(num_embeddings, embedding_dim, default_generator()) {}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen)
    : Module("Embedding"), num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  GW_CHECK(num_embeddings >= 0 && embedding_dim >= 0, InvalidArgumentError,
           "[Embedding] num_embeddings and embedding_dim must be non-negative, got ",
           num_embeddings, " and ", embedding_dim);
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  reset_parameters(gen);
}

void Embedding::reset_parameters(Generator& gen) { init::normal_(weight, gen, 0, 1); }

Tensor Embedding::forward(const Tensor& indices) {
  GW_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, DTypeError,
           "[Embedding] indices must be int64 or int32, got ", indices.dtype());
  return functional::embedding(indices, weight);
}

std::string Embedding::extra_repr() const {
  return detail::str(num_embeddings, ", ", embedding_dim);
}

}  // namespace gw::nn
