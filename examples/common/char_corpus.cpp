#include "examples/common/char_corpus.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>

#include <sys/wait.h>

#include "core/error.h"

namespace gw::data {

CharCorpus CharCorpus::from_text(std::string text) {
  GW_CHECK(!text.empty(), InvalidArgumentError, "[CharCorpus] the text is empty");
  std::array<bool, 256> seen{};
  for (unsigned char c : text) seen[c] = true;
  CharCorpus corpus{.text = std::move(text), .vocabulary = {}};
  for (int c = 0; c < 256; ++c)
    if (seen[static_cast<size_t>(c)]) corpus.vocabulary += static_cast<char>(c);
  return corpus;
}

std::vector<int64_t> CharCorpus::encode(const std::string& s) const {
  std::array<int64_t, 256> index;
  index.fill(-1);
  for (size_t i = 0; i < vocabulary.size(); ++i)
    index[static_cast<unsigned char>(vocabulary[i])] = static_cast<int64_t>(i);
  std::vector<int64_t> tokens;
  tokens.reserve(s.size());
  for (unsigned char c : s) {
    GW_CHECK(index[c] >= 0, InvalidArgumentError, "[CharCorpus] character ", static_cast<int>(c),
             " is not in the vocabulary of ", vocabulary.size());
    tokens.push_back(index[c]);
  }
  return tokens;
}

std::string CharCorpus::decode(const std::vector<int64_t>& tokens) const {
  std::string s;
  s.reserve(tokens.size());
  for (int64_t t : tokens) {
    GW_CHECK(t >= 0 && t < vocab_size(), InvalidArgumentError, "[CharCorpus] token ", t,
             " is outside the vocabulary of ", vocab_size());
    s += vocabulary[static_cast<size_t>(t)];
  }
  return s;
}

CharCorpus load_bible_kjv() {
  const char* missing =
      "[load_bible_kjv] could not read the Bible through the `bible` program "
      "(Debian: apt-get install bible-kjv)";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(
      ::popen("bible -f -l100000 Gen1:1-Rev22:21 2>/dev/null", "r"), ::pclose);
  GW_CHECK(pipe != nullptr, IoError, missing);
  std::string raw;
  std::array<char, 1 << 16> buffer;
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe.get())) > 0;)
    raw.append(buffer.data(), n);
  const bool read_failed = std::ferror(pipe.get()) != 0;
  const int status = ::pclose(pipe.release());
  const int exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  GW_CHECK(!read_failed && exit_code == 0 && raw.ends_with("Amen.\n"), IoError, missing,
           ": exit code ", exit_code, ", ", raw.size(), " bytes",
           read_failed ? ", read failed" : "");
  // "Ge1:1 In the beginning ...": each line without the reference before the first space.
  std::string text;
  text.reserve(raw.size());
  for (size_t at = 0; at < raw.size();) {
    size_t end = raw.find('\n', at);
    if (end == std::string::npos) end = raw.size();
    const size_t space = raw.find(' ', at);
    if (space != std::string::npos && space < end) text.append(raw, space + 1, end - space);
    at = end + 1;
  }
  if (!text.empty() && text.back() != '\n') text += '\n';
  return CharCorpus::from_text(std::move(text));
}

CharWindows::CharWindows(const CharCorpus& corpus, CorpusSplit split, int64_t context)
    : context_(context) {
  GW_CHECK(context > 0, InvalidArgumentError, "[CharWindows] context must be positive, got ",
           context);
  const size_t cut = corpus.text.size() * 9 / 10;
  tokens_ = corpus.encode(split == CorpusSplit::Train ? corpus.text.substr(0, cut)
                                                      : corpus.text.substr(cut));
  GW_CHECK(size() > 0, InvalidArgumentError, "[CharWindows] the ",
           split == CorpusSplit::Train ? "train" : "validation", " split has ", tokens_.size(),
           " tokens, not more than the context of ", context);
}

std::pair<Tensor, Tensor> CharWindows::batch(const std::vector<int64_t>& starts, int64_t first,
                                             int64_t batch) const {
  GW_CHECK(batch > 0 && first >= 0 && batch <= static_cast<int64_t>(starts.size()) - first,
           InvalidArgumentError, "[CharWindows] starts [", first, ", ", first + batch,
           ") outside the ", starts.size(), " given");
  std::vector<int64_t> x, y;
  x.reserve(static_cast<size_t>(batch * context_));
  y.reserve(x.capacity());
  for (int64_t b = first; b < first + batch; ++b) {
    const int64_t s = starts[static_cast<size_t>(b)];
    GW_CHECK(s >= 0 && s < size(), InvalidArgumentError, "[CharWindows] window start ", s,
             " outside [0, ", size(), ")");
    x.insert(x.end(), tokens_.begin() + s, tokens_.begin() + s + context_);
    y.insert(y.end(), tokens_.begin() + s + 1, tokens_.begin() + s + context_ + 1);
  }
  return {from_vector(x, {batch, context_}), from_vector(y, {batch, context_})};
}

}  // namespace gw::data
