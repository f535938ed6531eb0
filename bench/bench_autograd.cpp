// Autograd overhead: a chain of 1000 tiny (1-element) mul/add ops recorded and run backward,
// reported per node, against libtorch 1.13 running the same chain in the same run (the
// torch_anchor_autograd binary; its published figures when it was not built).
#include <vector>

#include "autograd/autograd.h"
#include "bench/harness.h"

namespace {

constexpr int kNodes = 1000;

// x -> x*c -> +c -> *c ... : kNodes recorded nodes.
gw::Tensor chain(const gw::Tensor& x, const gw::Tensor& c) {
  gw::Tensor y = x;
  for (int i = 0; i < kNodes; ++i) y = i % 2 == 0 ? gw::mul(y, c) : gw::add(y, c);
  return y;
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  gw::Tensor x = gw::ones({1}).requires_grad_();
  gw::Tensor c = gw::full({1}, 1.0001f);

  double fwd = gw::bench::seconds_per_call([&] { gw::bench::do_not_optimize(chain(x, c)); });
  double fwd_bwd = gw::bench::seconds_per_call([&] {
    gw::Tensor y = chain(x, c);
    y.backward();
    x.set_grad({});
  });
  const double fwd_us = fwd / kNodes * 1e6, total_us = fwd_bwd / kNodes * 1e6;
  const double bwd_us = total_us - fwd_us;

  // Published libtorch 1.13 figures, used only when the anchor binary is absent.
  double torch_fwd = 1.1, torch_bwd = 1.4;
  const char* note = gw::bench::kPublishedFigure;
  if (auto out = gw::bench::run_capture(gw::bench::executable_dir() + "/torch_anchor_autograd")) {
    auto f = gw::bench::json_number(*out, "forward_us"), b = gw::bench::json_number(*out, "backward_us");
    if (f && b) {
      torch_fwd = *f;
      torch_bwd = *b;
      note = "";
    }
  }
  if (report.wants("autograd", "chain forward")) {
    report.add({"autograd", "chain forward", fwd_us, "us", "libtorch 1.13", torch_fwd, note});
  }
  if (report.wants("autograd", "chain backward")) {
    report.add({"autograd", "chain backward", bwd_us, "us", "libtorch 1.13", torch_bwd, note});
  }
  if (report.wants("autograd", "chain fwd+bwd")) {
    report.add({"autograd", "chain fwd+bwd", total_us, "us", "libtorch 1.13", torch_fwd + torch_bwd,
                note});
  }
  return 0;
}
