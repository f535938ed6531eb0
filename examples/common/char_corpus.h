// A character-level corpus for the GPT examples: the King James Bible that Debian's bible-kjv
// package ships (public domain, ~4.1M characters, read through its `bible` program), its
// character vocabulary, a deterministic train/validation split, and (batch, context) windows
// whose starts a DistributedSampler shards across ranks.
//
//   gw::data::CharCorpus corpus = gw::data::load_bible_kjv();
//   gw::data::CharWindows train(corpus, gw::data::CorpusSplit::Train, /*context=*/128);
//   gw::dist::DistributedSampler sampler(train.size(), {.seed = 0});
//   auto [x, y] = train.batch(sampler.indices(), 0, 32);  // (32, 128) int64, y = x shifted by one
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace gw::data {

// A text and its vocabulary: the distinct characters (bytes), sorted; a token is an index.
struct CharCorpus {
  std::string text;
  std::string vocabulary;

  // From any text; throws InvalidArgumentError for an empty one.
  static CharCorpus from_text(std::string text);
  int64_t vocab_size() const { return static_cast<int64_t>(vocabulary.size()); }
  // Tokens of `s`; throws InvalidArgumentError naming a character outside the vocabulary.
  std::vector<int64_t> encode(const std::string& s) const;
  std::string decode(const std::vector<int64_t>& tokens) const;
};

// The Bible's text from `bible` (Debian: bible-kjv), one verse a line without its reference;
// throws IoError saying which package to install when the program is missing or fails.
CharCorpus load_bible_kjv();

enum class CorpusSplit { Train, Validation };

// The windows of one split: the first 90% of the text is Train, the rest Validation.
class CharWindows {
 public:
  // Throws InvalidArgumentError when the split is not longer than `context`.
  CharWindows(const CharCorpus& corpus, CorpusSplit split, int64_t context);
  // Windows: one per start position, each `context` tokens and the next one.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()) - context_; }
  int64_t context() const { return context_; }
  // Inputs and targets (batch, context) int64 for the window starts
  // starts[first], ..., starts[first + batch - 1] (starts: e.g. a DistributedSampler's
  // indices()); targets are the inputs shifted by one token.
  std::pair<Tensor, Tensor> batch(const std::vector<int64_t>& starts, int64_t first,
                                  int64_t batch) const;

 private:
  std::vector<int64_t> tokens_;
  int64_t context_;
};

}  // namespace gw::data
