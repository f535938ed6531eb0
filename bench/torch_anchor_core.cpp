// libtorch 1.13 on the cases of bench_core, run as a separate process so that gradwire's
// binaries never link libtorch. Prints one JSON line of nanoseconds per call.
#include <ATen/ATen.h>

#include <iostream>

#include "bench/harness.h"

int main() {
  at::Tensor a = at::ones({1}), b = at::ones({1});
  double add = gw::bench::seconds_per_call([&] { gw::bench::do_not_optimize(at::add(a, b)); });
  double add_ = gw::bench::seconds_per_call([&] { a.add_(b); });
  std::cout << "{\"add_ns\":" << add * 1e9 << ",\"add_inplace_ns\":" << add_ * 1e9 << "}\n";
  return 0;
}
