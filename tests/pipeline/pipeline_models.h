// The pipeline tests' models and data (test_pipeline.cpp, test_pipeline_2d.cpp): a small float64
// GPT, its stages and loss, a batch of tokens, and a 4-stage model whose first and third stages
// share a weight, with each_once to list its parameters once.
#pragma once

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "nn/nn.h"
#include "tests/pipeline/tiny_gpt.h"

namespace pipeline_test {

constexpr int64_t kVocab = 11, kLength = 8, kLayers = 8;

inline std::shared_ptr<gw::nn::GPT> gpt() { return tiny_gpt(kVocab, kLength, kLayers, 5); }

// Stage s of `stages`: its share of the blocks, the embeddings before the first, the head after
// the last.
inline std::shared_ptr<gw::nn::Module> stage_of(const gw::nn::GPT& g, int s, int stages) {
  return g.stage(s, stages);
}

inline gw::Tensor loss_fn(const gw::Tensor& logits, const gw::Tensor& targets) {
  return gw::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
}

inline std::pair<gw::Tensor, gw::Tensor> batch(int64_t n) {
  gw::Generator gen(77);
  gw::Tensor t = gw::randint(0, kVocab, {n, kLength + 1}, gen);
  return {t.narrow(1, 0, kLength).contiguous(), t.narrow(1, 1, kLength).contiguous()};
}

// A 4-stage float64 language model whose token embedding (stage 0) and a projection onto the
// vocabulary (stage 2) share one weight, as a GPT's embedding and head do: stage 0 embeds the
// tokens, stage 1 mixes them, stage 2 scores them against the embedding, stage 3 maps the
// scores to the logits. The same init every time, tied before the model is cut.
struct TiedPart : gw::nn::Module {
  int index;
  std::shared_ptr<gw::nn::Module> layer;
  TiedPart(int index, std::shared_ptr<gw::nn::Module> inner) : Module("TiedPart"), index(index) {
    layer = register_module("layer", std::move(inner));
  }
  gw::Tensor forward(const gw::Tensor& x) override {
    const gw::Tensor h = (*layer)(x);
    return index == 1 || index == 2 ? h.tanh() : h;
  }
};

inline std::vector<std::shared_ptr<gw::nn::Module>> tied_parts() {
  gw::Generator gen(13);
  auto emb = std::make_shared<gw::nn::Embedding>(kVocab, 6, gen);
  auto mix = std::make_shared<gw::nn::Linear>(6, 6, true, gen);
  auto proj = std::make_shared<gw::nn::Linear>(6, kVocab, false, gen);
  proj->tie_weight(emb->weight);
  auto logits = std::make_shared<gw::nn::Linear>(kVocab, kVocab, true, gen);
  const std::vector<std::shared_ptr<gw::nn::Module>> layers{emb, mix, proj, logits};
  std::vector<std::shared_ptr<gw::nn::Module>> parts;
  for (int i = 0; i < 4; ++i) {
    parts.push_back(std::make_shared<TiedPart>(i, layers[static_cast<size_t>(i)]));
    parts.back()->to(gw::kFloat64);  // in place: the tie holds
  }
  return parts;
}

// The parameters of `parts`, each once (a tied one is listed by both its stages).
inline std::vector<gw::Tensor> each_once(
    const std::vector<std::shared_ptr<gw::nn::Module>>& parts) {
  std::vector<gw::Tensor> out;
  for (const auto& part : parts)
    for (const gw::Tensor& t : part->parameters())
      if (std::none_of(out.begin(), out.end(), [&](const gw::Tensor& o) { return o.same(t); }))
        out.push_back(t);
  return out;
}

}  // namespace pipeline_test
