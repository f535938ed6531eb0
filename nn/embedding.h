// Embedding: a lookup table of num_embeddings vectors; integer indices of any shape pick rows.
//
//   auto emb = std::make_shared<gw::nn::Embedding>(10000, 64, gen);
//   gw::Tensor v = emb->forward(token_ids);  // int64 (B, T) -> (B, T, 64)
//   gw::nn::Embedding padded(10000, 64, {.padding_idx = 0}, gen);  // row 0: zeros, no gradient
#pragma once

#include <optional>

#include "core/random.h"
#include "nn/module.h"

namespace gw::nn {

struct EmbeddingOptions {
  // A row that stays as it was (zeros from reset_parameters) and gets no gradient: a padding
  // token's (PyTorch's padding_idx; negative counts from the end).
  std::optional<int64_t> padding_idx;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen);
  Embedding(int64_t num_embeddings, int64_t embedding_dim);  // default generator
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options,
            Generator& gen);

  // int64/int32 indices in [0, num_embeddings) -> indices.shape + (embedding_dim).
  Tensor forward(const Tensor& indices) override;
  // PyTorch's init: N(0, 1), and the padding row zero.
  void reset_parameters(Generator& gen);

  const int64_t num_embeddings;
  const int64_t embedding_dim;
  const std::optional<int64_t> padding_idx;  // in [0, num_embeddings)
  Tensor weight;  // (num_embeddings, embedding_dim)

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
