// libtorch 1.13 on bench_autograd's chain, in its own process. Prints microseconds per node.
#include <torch/torch.h>

#include <iostream>

#include "bench/harness.h"

int main() {
  constexpr int kNodes = 1000;
  torch::Tensor x = torch::ones({1}, torch::requires_grad());
  torch::Tensor c = torch::full({1}, 1.0001f);
  auto chain = [&] {
    torch::Tensor y = x;
    for (int i = 0; i < kNodes; ++i) y = i % 2 == 0 ? torch::mul(y, c) : torch::add(y, c);
    return y;
  };
  double fwd = gw::bench::seconds_per_call([&] { gw::bench::do_not_optimize(chain()); });
  double total = gw::bench::seconds_per_call([&] {
    torch::Tensor y = chain();
    y.backward();
    x.mutable_grad().reset();
  });
  std::cout << "{\"forward_us\":" << fwd / kNodes * 1e6
            << ",\"backward_us\":" << (total - fwd) / kNodes * 1e6 << "}\n";
  return 0;
}
