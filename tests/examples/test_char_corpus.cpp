// The character corpus of the GPT examples: vocabulary, windows and their split, and the Bible
// as Debian's bible-kjv ships it.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "dist/data/distributed_sampler.h"
#include "examples/common/char_corpus.h"
#include "examples/common/gpt_recipe.h"
#include "tests/skip.h"

using gw::data::CharCorpus;
using gw::data::CharWindows;
using gw::data::CorpusSplit;

TEST_CASE("a character corpus: sorted vocabulary, tokens both ways", "[examples][corpus]") {
  CharCorpus c = CharCorpus::from_text("hello, world\n");
  CHECK(c.vocabulary == "\n ,dehlorw");
  std::vector<int64_t> tokens = c.encode("world");
  CHECK(tokens == std::vector<int64_t>{9, 7, 8, 6, 3});
  CHECK(c.decode(tokens) == "world");
  CHECK_THROWS_WITH(c.encode("word!"), Catch::Contains("character 33"));
  CHECK_THROWS_WITH(c.decode({10}), Catch::Contains("token 10"));
  CHECK_THROWS_AS(CharCorpus::from_text(""), gw::InvalidArgumentError);
}

TEST_CASE("windows: the first 90% trains, targets are the inputs shifted by one",
          "[examples][corpus]") {
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  CharCorpus c = CharCorpus::from_text(text);
  CharWindows train(c, CorpusSplit::Train, 8), val(c, CorpusSplit::Validation, 8);
  CHECK(train.size() == 90 - 8);
  CHECK(val.size() == 10 - 8);
  auto [x, y] = train.batch({5, 0, 81}, 1, 2);  // starts 0 and 81
  CHECK(x.sizes() == gw::Shape{2, 8});
  CHECK(c.decode(x.to_vector<int64_t>()) == text.substr(0, 8) + text.substr(81, 8));
  CHECK(c.decode(y.to_vector<int64_t>()) == text.substr(1, 8) + text.substr(82, 8));
  auto [vx, vy] = val.batch({1}, 0, 1);
  CHECK(c.decode(vx.to_vector<int64_t>()) == text.substr(91, 8));
  CHECK_THROWS_WITH(train.batch({82}, 0, 1), Catch::Contains("window start 82"));
  CHECK_THROWS_WITH(CharWindows(c, CorpusSplit::Validation, 10),
                    Catch::Contains("validation split has 10 tokens"));
  // Two ranks' samplers share the windows out between them.
  std::set<int64_t> seen;
  for (int rank = 0; rank < 2; ++rank)
    for (int64_t s :
         gw::dist::DistributedSampler(train.size(), {.num_replicas = 2, .rank = rank}).indices())
      seen.insert(s);
  CHECK(static_cast<int64_t>(seen.size()) == train.size());
}

TEST_CASE("the King James Bible from Debian's bible-kjv", "[examples][corpus]") {
  if (std::system("command -v bible >/dev/null 2>&1") != 0)
    GW_SKIP("no `bible` program (Debian: bible-kjv)");
  CharCorpus bible = gw::data::load_bible_kjv();
  CHECK(bible.text.size() > 4'000'000);
  CHECK(bible.text.starts_with("In the beginning God created the heaven and the earth.\n"));
  CHECK(bible.text.find("Ge1:1") == std::string::npos);  // no verse references
  CHECK(bible.vocab_size() > 50);
  CHECK(bible.vocab_size() < 100);
  CharWindows val(bible, CorpusSplit::Validation, 256);
  CHECK(val.size() > 400'000);
}

TEST_CASE("a checkpoint's recipe values are exact, and earlier runs' 6-digit ones still match",
          "[examples][checkpoint]") {
  using gw::examples::exact_text;
  using gw::examples::same_value;
  CHECK(exact_text(0.001) == "0.001");
  CHECK(std::stod(exact_text(0.0010000004)) == 0.0010000004);  // not "0.001"
  CHECK(same_value(exact_text(3e-4), "0.0003"));               // written before: 6 digits
  CHECK_FALSE(same_value(exact_text(0.0010000004), "0.001"));
  CHECK_FALSE(same_value("0.001", "0.001x"));
  CHECK(same_value("gloo", "gloo"));
  CHECK_FALSE(same_value("gloo", "mpi"));
}
