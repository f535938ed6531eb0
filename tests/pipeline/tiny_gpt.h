// The pipeline tests' model: a small float64 GPT (2 heads, width 8, no dropout), its head
// untied from the embedding, as a pipeline cuts them apart. The same seed gives the same model.
#pragma once

#include <memory>

#include "nn/transformer.h"

namespace pipeline_test {

inline std::shared_ptr<gw::nn::GPT> tiny_gpt(int64_t vocab, int64_t length, int64_t layers,
                                             uint64_t seed) {
  gw::Generator gen(seed);
  auto model = std::make_shared<gw::nn::GPT>(gw::nn::GPTOptions{.vocab_size = vocab,
                                                                .context = length,
                                                                .layers = layers,
                                                                .heads = 2,
                                                                .width = 8,
                                                                .dropout = 0.0,
                                                                .bias = true,
                                                                .tie_weights = false},
                                             gen);
  model->to(gw::kFloat64);
  return model;
}

}  // namespace pipeline_test
