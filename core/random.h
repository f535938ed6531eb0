// Reproducible random numbers. A Generator is a small counter-free PRNG (xoshiro256**, seeded
// through splitmix64); floats are built from its bits and normals with Box-Muller in double,
// so the same seed gives the same numbers on every platform and compiler. Every random op takes
// a Generator explicitly; the overloads without one use the process default, which
// `manual_seed` reseeds.
//
//   gw::Generator gen(42);
//   gw::Tensor w = gw::randn({256, 784}, gen);
//   gw::manual_seed(0);  // the default generator
#pragma once

#include <cstdint>
#include <mutex>

namespace gw {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x853c49e6748fea9bULL) { manual_seed(seed); }

  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const { return seed_; }

  // Where the stream is (PyTorch's get_state/set_state): set_state(s) makes the generator draw
  // again what it drew after get_state() returned s. Both lock mutex().
  struct State {
    uint64_t seed = 0;
    uint64_t s[4] = {};
    bool has_spare_normal = false;
    double spare_normal = 0;
  };
  State get_state();
  void set_state(const State& state);

  uint64_t next_u64();
  double next_double();  // [0, 1) with 53 random bits
  float next_float();    // [0, 1) with 24 random bits
  double next_normal();  // standard normal (Box-Muller; the second value is kept for the next call)
  // Uniform integer in [0, n) without modulo bias.
  uint64_t next_below(uint64_t n);

  // Generators are shared across threads through the default one; ops lock it while they draw.
  std::mutex& mutex() { return mutex_; }

 private:
  uint64_t seed_ = 0;
  uint64_t s_[4] = {};
  bool has_spare_normal_ = false;
  double spare_normal_ = 0;
  std::mutex mutex_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace gw
