// Random numbers (core/random.h, core/ops/random_ops.h): the generator is checked bit for bit
// against a reference xoshiro256** + splitmix64 written here (that is what makes "the same
// numbers on every platform" a tested property), then the distributions statistically.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <set>
#include <vector>

#include "core/ops.h"
#include "tests/core/test_util.h"

using gw::Shape;
using gw::Tensor;

using core_test::ThreadsGuard;

namespace {

// The published reference algorithms: xoshiro256** and splitmix64 (Blackman and Vigna).
struct ReferenceXoshiro {
  uint64_t s[4];

  static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  explicit ReferenceXoshiro(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& v : s) v = splitmix64(x);
  }
  uint64_t next() {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }
  double next_double() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  float next_float() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }
};

struct Moments {
  double mean = 0, std = 0;
};
Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(ss / static_cast<double>(v.size() - 1));
  return m;
}


}  // namespace

// --- the generator itself -------------------------------------------------------------------

TEST_CASE("the reference implementation reproduces the published values", "[core][random]") {
  uint64_t x = 0;
  CHECK(ReferenceXoshiro::splitmix64(x) == 0xe220a8397b1dcdafULL);  // splitmix64, seed 0
  ReferenceXoshiro ref(0);
  CHECK(ref.next() == 0x99ec5f36cb75f2b4ULL);
  CHECK(ref.next() == 0xbf6e1f784956452aULL);
  CHECK(ref.next() == 0x1a5f849d4933e6e0ULL);
}

TEST_CASE("Generator is xoshiro256** seeded with splitmix64", "[core][random]") {
  SECTION("seed 0: pinned values") {
    gw::Generator gen(0);
    CHECK(gen.next_u64() == 0x99ec5f36cb75f2b4ULL);
    CHECK(gen.next_u64() == 0xbf6e1f784956452aULL);
    CHECK(gen.next_u64() == 0x1a5f849d4933e6e0ULL);
  }
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, ~uint64_t{0}}) {
    CAPTURE(seed);
    gw::Generator gen(seed);
    ReferenceXoshiro ref(seed);
    CHECK(gen.initial_seed() == seed);
    bool all_equal = true;
    for (int i = 0; i < 1000; ++i) all_equal &= gen.next_u64() == ref.next();
    CHECK(all_equal);
    CHECK(gen.next_double() == ref.next_double());
    CHECK(gen.next_float() == ref.next_float());
  }
}

TEST_CASE("a Generator's state, set again, draws again what it drew", "[core][random]") {
  gw::Generator gen(5);
  gen.next_normal();  // a spare normal kept: part of the state
  const gw::Generator::State saved = gen.get_state();
  std::vector<double> first;
  for (int i = 0; i < 5; ++i) first.push_back(gen.next_normal());
  first.push_back(static_cast<double>(gen.next_u64()));
  gw::Generator other(6);  // another seed: set_state carries everything over
  for (gw::Generator* g : {&gen, &other}) {
    g->set_state(saved);
    std::vector<double> again;
    for (int i = 0; i < 5; ++i) again.push_back(g->next_normal());
    again.push_back(static_cast<double>(g->next_u64()));
    CHECK(again == first);
    CHECK(g->initial_seed() == 5);
  }
}

TEST_CASE("next_normal is Box-Muller on two uniform doubles", "[core][random]") {
  gw::Generator gen(3);
  ReferenceXoshiro ref(3);
  for (int i = 0; i < 50; ++i) {
    double u1 = 1.0 - ref.next_double(), u2 = ref.next_double();
    double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * std::numbers::pi * u2;
    CHECK(gen.next_normal() == Approx(r * std::cos(theta)).epsilon(1e-14));
    CHECK(gen.next_normal() == Approx(r * std::sin(theta)).epsilon(1e-14));  // the spare
  }
}

TEST_CASE("next_below stays below n and is unbiased", "[core][random]") {
  gw::Generator gen(11);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) {
    uint64_t v = gen.next_below(7);
    REQUIRE(v < 7);
    ++counts[v];
  }
  for (int c : counts) CHECK(std::abs(c - 10000) < 500);  // ~5 sigma
  CHECK(gen.next_below(1) == 0);
}

TEST_CASE("manual_seed restarts a generator", "[core][random]") {
  gw::Generator gen(5);
  uint64_t first = gen.next_u64();
  gen.next_normal();  // leaves a spare normal behind
  gen.manual_seed(5);
  CHECK(gen.next_u64() == first);
  gen.manual_seed(9);
  CHECK(gen.initial_seed() == 9);
  CHECK(gen.next_u64() == ReferenceXoshiro(9).next());
  // The spare normal is discarded by reseeding.
  gw::Generator a(2), b(2);
  a.next_normal();
  a.manual_seed(2);
  CHECK(a.next_normal() == b.next_normal());
}

// --- tensors from generators ----------------------------------------------------------------

TEST_CASE("random tensors draw from the generator in row-major order", "[core][random]") {
  gw::Generator gen(21), mirror(21);
  Tensor u = gw::rand({2, 3}, gen);
  CHECK(u.dtype() == gw::kFloat32);
  CHECK(u.sizes() == Shape{2, 3});
  std::vector<float> want;
  for (int i = 0; i < 6; ++i) want.push_back(mirror.next_float());
  CHECK(u.to_vector<float>() == want);

  Tensor d = gw::rand({4}, gen, gw::kFloat64);
  std::vector<double> wantd;
  for (int i = 0; i < 4; ++i) wantd.push_back(mirror.next_double());
  CHECK(d.to_vector<double>() == wantd);

  Tensor n = gw::randn({5}, gen, gw::kFloat64);
  std::vector<double> wantn;
  for (int i = 0; i < 5; ++i) wantn.push_back(mirror.next_normal());
  CHECK(n.to_vector<double>() == wantn);
}

TEST_CASE("the same seed gives the same tensors; different seeds differ", "[core][random]") {
  gw::Generator a(123), b(123), c(124);
  Tensor ra = gw::randn({1000}, a), rb = gw::randn({1000}, b), rc = gw::randn({1000}, c);
  CHECK(gw::equal(ra, rb));
  CHECK_FALSE(gw::equal(ra, rc));
  CHECK(gw::equal(gw::rand({10, 10}, a), gw::rand({10, 10}, b)));
  CHECK(gw::equal(gw::randint(0, 100, {50}, a), gw::randint(0, 100, {50}, b)));
  CHECK(gw::equal(gw::randperm(100, a), gw::randperm(100, b)));
  Tensor p = gw::full({64}, 0.5);
  CHECK(gw::equal(gw::bernoulli(p, a), gw::bernoulli(p, b)));
  // Draws advance the generator: the next tensor differs from the first.
  gw::Generator d(7);
  CHECK_FALSE(gw::equal(gw::rand({100}, d), gw::rand({100}, d)));
}

TEST_CASE("manual_seed resets the default generator", "[core][random]") {
  gw::manual_seed(77);
  CHECK(gw::default_generator().initial_seed() == 77);
  Tensor a = gw::rand({100});
  Tensor an = gw::randn({100});
  gw::manual_seed(77);
  Tensor b = gw::rand({100});
  Tensor bn = gw::randn({100});
  CHECK(gw::equal(a, b));
  CHECK(gw::equal(an, bn));
  gw::Generator same(77);
  CHECK(gw::equal(gw::rand({100}, same), a));
  // The in-place methods use the default generator too.
  gw::manual_seed(78);
  Tensor u = gw::empty({50});
  u.uniform_(-1, 1);
  Tensor v = gw::empty({50});
  v.normal_(0, 2);
  gw::manual_seed(78);
  Tensor u2 = gw::empty({50}), v2 = gw::empty({50});
  u2.uniform_(-1, 1);
  v2.normal_(0, 2);
  CHECK(gw::equal(u, u2));
  CHECK(gw::equal(v, v2));
  CHECK(gw::equal(gw::randint(0, 9, {20}), gw::randint(0, 9, {20})) == false);
}

// --- distributions --------------------------------------------------------------------------

TEST_CASE("uniform draws cover [from, to) with the right moments", "[core][random]") {
  gw::Generator gen(1);
  SECTION("rand in float32 and float64") {
    for (gw::DType dt : {gw::kFloat32, gw::kFloat64}) {
      CAPTURE(dt);
      std::vector<double> v = gw::rand({100000}, gen, dt).to_vector<double>();
      for (double x : v) REQUIRE((x >= 0.0 && x < 1.0));
      Moments m = moments(v);
      CHECK(m.mean == Approx(0.5).margin(0.01));
      CHECK(m.std == Approx(std::sqrt(1.0 / 12)).margin(0.005));
    }
  }
  SECTION("uniform_ on a range") {
    Tensor t = gw::empty({100000}, gw::kFloat64);
    uint64_t v0 = t.storage()->version();
    gw::uniform_(t, -2, 3, gen);
    CHECK(t.storage()->version() > v0);
    std::vector<double> v = t.to_vector<double>();
    for (double x : v) REQUIRE((x >= -2.0 && x < 3.0));
    Moments m = moments(v);
    CHECK(m.mean == Approx(0.5).margin(0.03));
    CHECK(m.std == Approx(5 / std::sqrt(12.0)).margin(0.02));
    CHECK(*std::min_element(v.begin(), v.end()) < -1.99);
    CHECK(*std::max_element(v.begin(), v.end()) > 2.99);
  }
}

TEST_CASE("normal draws have the requested mean and std", "[core][random]") {
  gw::Generator gen(2);
  for (gw::DType dt : {gw::kFloat32, gw::kFloat64}) {
    CAPTURE(dt);
    std::vector<double> v = gw::randn({100000}, gen, dt).to_vector<double>();
    Moments m = moments(v);
    CHECK(m.mean == Approx(0.0).margin(0.02));
    CHECK(m.std == Approx(1.0).margin(0.02));
    double within = 0;
    for (double x : v) within += std::fabs(x) < 1.0;
    CHECK(within / 1e5 == Approx(0.6827).margin(0.01));
  }
  Tensor t = gw::empty({100000});
  gw::normal_(t, 3.0, 0.5, gen);
  Moments m = moments(t.to_vector<double>());
  CHECK(m.mean == Approx(3.0).margin(0.02));
  CHECK(m.std == Approx(0.5).margin(0.01));
}

TEST_CASE("randint covers [low, high) evenly", "[core][random]") {
  gw::Generator gen(3);
  Tensor t = gw::randint(-3, 7, {20000}, gen);
  CHECK(t.dtype() == gw::kInt64);
  std::vector<int> counts(10, 0);
  for (int64_t v : t.to_vector<int64_t>()) {
    REQUIRE((v >= -3 && v < 7));
    ++counts[v + 3];
  }
  for (int c : counts) CHECK(std::abs(c - 2000) < 250);  // every value hit, ~6 sigma
  Tensor i32 = gw::randint(0, 2, {1000}, gen, gw::kInt32);
  CHECK(i32.dtype() == gw::kInt32);
  std::set<int32_t> seen;
  for (int32_t v : i32.to_vector<int32_t>()) seen.insert(v);
  CHECK(seen == std::set<int32_t>{0, 1});
  CHECK(gw::randint(5, 6, {10}, gen).to_vector<int64_t>() == std::vector<int64_t>(10, 5));
}

TEST_CASE("randperm is a permutation", "[core][random]") {
  gw::Generator gen(4);
  Tensor p = gw::randperm(1000, gen);
  CHECK(p.dtype() == gw::kInt64);
  std::vector<int64_t> v = p.to_vector<int64_t>();
  std::vector<int64_t> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  for (int64_t i = 0; i < 1000; ++i) iota[i] = i;
  CHECK(sorted == iota);
  CHECK(v != iota);  // shuffled (a fixed point of all 1000 has probability 1/1000!)
  CHECK(gw::randperm(0, gen).numel() == 0);
  CHECK(gw::randperm(1, gen).to_vector<int64_t>() == std::vector<int64_t>{0});
  // Every position takes every value over many small permutations.
  std::vector<std::vector<int>> hits(4, std::vector<int>(4, 0));
  for (int r = 0; r < 4000; ++r) {
    std::vector<int64_t> q = gw::randperm(4, gen).to_vector<int64_t>();
    for (int i = 0; i < 4; ++i) ++hits[i][q[i]];
  }
  for (const auto& row : hits)
    for (int h : row) CHECK(std::abs(h - 1000) < 150);
}

TEST_CASE("bernoulli draws 1 with the given probability", "[core][random]") {
  gw::Generator gen(5);
  SECTION("a constant p in place") {
    Tensor t = gw::empty({100000});
    gw::bernoulli_(t, 0.3, gen);
    std::vector<float> v = t.to_vector<float>();
    double ones = 0;
    for (float x : v) {
      REQUIRE((x == 0.f || x == 1.f));
      ones += x;
    }
    CHECK(ones / 1e5 == Approx(0.3).margin(0.01));
  }
  SECTION("a tensor of probabilities") {
    std::vector<double> probs;
    for (int i = 0; i < 30000; ++i) probs.push_back(i % 3 == 0 ? 0.0 : i % 3 == 1 ? 1.0 : 0.25);
    Tensor p = gw::from_vector(probs);
    Tensor draws = gw::bernoulli(p, gen);
    CHECK(draws.dtype() == gw::kFloat64);
    std::vector<double> d = draws.to_vector<double>();
    double quarter = 0;
    for (int i = 0; i < 30000; ++i) {
      if (i % 3 == 0) REQUIRE(d[i] == 0.0);
      if (i % 3 == 1) REQUIRE(d[i] == 1.0);
      if (i % 3 == 2) quarter += d[i];
    }
    CHECK(quarter / 10000 == Approx(0.25).margin(0.02));
  }
}

TEST_CASE("random draws do not depend on the thread count", "[core][random][parallel]") {
  ThreadsGuard guard;
  auto draw = [] {
    gw::Generator gen(99);
    std::vector<Tensor> out;
    out.push_back(gw::randn({300000}, gen));
    out.push_back(gw::rand({500, 700}, gen, gw::kFloat64));
    out.push_back(gw::randint(0, 1000, {200000}, gen));
    Tensor view = gw::empty({400, 300}).t();
    gw::normal_(view, 1.0, 2.0, gen);
    out.push_back(view);
    out.push_back(gw::bernoulli(gw::full({100000}, 0.5), gen));
    return out;
  };
  gw::set_num_threads(1);
  std::vector<Tensor> one = draw();
  gw::set_num_threads(4);
  std::vector<Tensor> four = draw();
  REQUIRE(one.size() == four.size());
  for (size_t i = 0; i < one.size(); ++i) {
    CAPTURE(i);
    CHECK(gw::equal(one[i], four[i]));
  }
}
