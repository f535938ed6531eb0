#include "core/random.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <numbers>

namespace gw {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
  has_spare_normal_ = false;
}

Generator::State Generator::get_state() {
  std::lock_guard lock(mutex_);
  State state{.seed = seed_, .has_spare_normal = has_spare_normal_, .spare_normal = spare_normal_};
  std::copy(std::begin(s_), std::end(s_), state.s);
  return state;
}

void Generator::set_state(const State& state) {
  std::lock_guard lock(mutex_);
  seed_ = state.seed;
  std::copy(std::begin(state.s), std::end(state.s), s_);
  has_spare_normal_ = state.has_spare_normal;
  spare_normal_ = state.spare_normal;
}

uint64_t Generator::next_u64() {  // xoshiro256**
  uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = std::rotl(s_[3], 45);
  return result;
}

double Generator::next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
float Generator::next_float() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

double Generator::next_normal() {
  if (has_spare_normal_) {
    has_spare_normal_ = false;
    return spare_normal_;
  }
  double u1 = 1.0 - next_double();  // (0, 1]: log stays finite
  double u2 = next_double();
  double r = std::sqrt(-2.0 * std::log(u1));
  double theta = 2.0 * std::numbers::pi * u2;
  spare_normal_ = r * std::sin(theta);
  has_spare_normal_ = true;
  return r * std::cos(theta);
}

uint64_t Generator::next_below(uint64_t n) {
  // Lemire's multiply-shift with rejection of the biased low range.
  unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next_u64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) {
  Generator& gen = default_generator();
  std::lock_guard lock(gen.mutex());
  gen.manual_seed(seed);
}

}  // namespace gw
