// Embedding: a lookup table of num_embeddings vectors; integer indices of any shape pick rows.
//
//   auto emb = std::make_shared<gw::nn::Embedding>(10000, 64, gen);
//   gw::Tensor v = emb->forward(token_ids);  // int64 (B, T) -> (B, T, 64)
#pragma once

#include "core/random.h"
#include "nn/module.h"

namespace gw::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen);
  Embedding(int64_t num_embeddings, int64_t embedding_dim);  // default generator

  // int64/int32 indices in [0, num_embeddings) -> indices.shape + (embedding_dim).
  Tensor forward(const Tensor& indices) override;
  // PyTorch's init: N(0, 1).
  void reset_parameters(Generator& gen);

  const int64_t num_embeddings;
  const int64_t embedding_dim;
  Tensor weight;  // (num_embeddings, embedding_dim)

 protected:
  std::string extra_repr() const override;
};

}  // namespace gw::nn
