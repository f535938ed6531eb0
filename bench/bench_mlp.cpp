// One SGD training step of the Fashion-MNIST MLP (784-256-128-10, batch 64): forward,
// cross-entropy, backward, update. Anchors measured in the same run: Debian's PyTorch 1.13
// running the same step (bench/torch_anchor_mlp.py), and the eight raw Eigen GEMMs the step
// consists of — the floor any implementation pays.
#include <Eigen/Core>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench/harness.h"
#include "nn/nn.h"
#include "optim/optim.h"

namespace {

constexpr int64_t kBatch = 64;
constexpr int64_t kDims[] = {784, 256, 128, 10};

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The GEMMs of one step: 3 forward (x·Wᵀ), 3 weight gradients (gᵀ·h), 2 input gradients (g·W;
// the first layer needs none), timed in alternation with `step`.
std::pair<double, double> step_and_gemm_seconds(const std::function<void()>& step) {
  std::vector<Mat> w, h, g, dw;
  for (int l = 0; l < 3; ++l) {
    w.push_back(Mat::Random(kDims[l + 1], kDims[l]));
    h.push_back(Mat::Random(kBatch, kDims[l]));
    g.push_back(Mat::Random(kBatch, kDims[l + 1]));
    dw.push_back(Mat(kDims[l + 1], kDims[l]));
  }
  std::vector<Mat> out(3), dh(3);
  for (int l = 0; l < 3; ++l) {
    out[l].resize(kBatch, kDims[l + 1]);
    dh[l].resize(kBatch, kDims[l]);
  }
  return gw::bench::seconds_per_call_pair(step, [&] {
    for (int l = 0; l < 3; ++l) out[l].noalias() = h[l] * w[l].transpose();
    for (int l = 2; l >= 0; --l) {
      dw[l].noalias() = g[l].transpose() * h[l];
      if (l > 0) dh[l].noalias() = g[l] * w[l];
    }
    gw::bench::do_not_optimize(out[2].data());
  });
}

}  // namespace

int main(int argc, char** argv) {
  gw::bench::Reporter report(argc, argv);
  if (!report.wants("mlp", "sgd step b64")) return 0;
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Sequential>();
  model->push_back(std::make_shared<gw::nn::Linear>(784, 256, true, gen));
  model->push_back(std::make_shared<gw::nn::ReLU>());
  model->push_back(std::make_shared<gw::nn::Linear>(256, 128, true, gen));
  model->push_back(std::make_shared<gw::nn::ReLU>());
  model->push_back(std::make_shared<gw::nn::Linear>(128, 10, true, gen));
  gw::optim::SGD opt(model->parameters(), gw::optim::SGDOptions{.lr = 0.01});
  gw::Tensor x = gw::randn({kBatch, 784}, gen);
  gw::Tensor y = gw::randint(0, 10, {kBatch}, gen);
  auto [step, gemms] = step_and_gemm_seconds([&] {
    opt.zero_grad();
    gw::Tensor loss = gw::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
  });
  const double step_us = step * 1e6;

  std::string script = gw::bench::executable_dir() + "/torch_anchor_mlp.py";
  if (auto out = gw::bench::run_capture("/usr/bin/python3 " + script + " 2>/dev/null")) {
    if (auto torch_us = gw::bench::json_number(*out, "step_us")) {
      report.add({"mlp", "sgd step b64", step_us, "us", "pytorch 1.13", *torch_us,
                  gw::bench::blas_note(*out)});
    }
  } else {
    report.add({"mlp", "sgd step b64", step_us, "us", "pytorch 1.13", 0,
                "python3-torch not available"});
  }
  report.add({"mlp", "sgd step b64", step_us, "us", "raw eigen gemms", gemms * 1e6});
  return 0;
}
