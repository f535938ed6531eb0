// Trains an MLP (784-256-128-10) or a small CNN on Fashion-MNIST with SGD or Adam, showing a
// progress bar, the test accuracy after every epoch, and optionally saving the model
// (safetensors) and the loss curve (CSV + SVG).
//
//   build/examples/mnist_train --epochs 5                 # MLP, SGD with momentum
//   build/examples/mnist_train --model cnn --optimizer adam --lr 1e-3
//   build/examples/mnist_train --save mlp.safetensors --curve loss
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "autograd/autograd.h"
#include "examples/common/fashion_mnist.h"
#include "examples/common/models.h"
#include "examples/common/progress.h"
#include "nn/nn.h"
#include "optim/optim.h"

namespace {

struct Args {
  std::string model = "mlp", optimizer = "sgd", save, curve;
  int epochs = 5;
  int64_t batch_size = 64, limit = 0;
  double lr = -1;  // default depends on the optimizer
  double lr_decay = 0.6;  // lr multiplier after every epoch (StepLR with step_size 1)
  uint64_t seed = 0;
  int threads = 1;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: mnist_train [--model mlp|cnn] [--optimizer sgd|adam] [--epochs N]\n"
               "                   [--batch-size N] [--lr X] [--lr-decay X] [--seed N] [--limit N]\n"
               "                   [--threads N] [--save FILE.safetensors] [--curve PREFIX]\n",
               msg);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--model") a.model = value();
    else if (k == "--optimizer") a.optimizer = value();
    else if (k == "--epochs") a.epochs = std::stoi(value());
    else if (k == "--batch-size") a.batch_size = std::stoll(value());
    else if (k == "--lr") a.lr = std::stod(value());
    else if (k == "--lr-decay") a.lr_decay = std::stod(value());
    else if (k == "--seed") a.seed = std::stoull(value());
    else if (k == "--limit") a.limit = std::stoll(value());
    else if (k == "--threads") a.threads = std::stoi(value());
    else if (k == "--save") a.save = value();
    else if (k == "--curve") a.curve = value();
    else usage(("unknown argument " + k).c_str());
  }
  if (a.model != "mlp" && a.model != "cnn") usage("--model must be mlp or cnn");
  if (a.optimizer != "sgd" && a.optimizer != "adam") usage("--optimizer must be sgd or adam");
  if (a.lr < 0) a.lr = a.optimizer == "sgd" ? 0.02 : 1e-3;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  gw::set_num_threads(args.threads);
  try {
    gw::data::Dataset train = gw::data::load_fashion_mnist(gw::data::Split::Train, args.limit);
    gw::data::Dataset test = gw::data::load_fashion_mnist(gw::data::Split::Test);
    gw::Generator gen(args.seed);
    auto model = gw::examples::fashion_model(args.model, gen);
    std::unique_ptr<gw::optim::Optimizer> opt;
    if (args.optimizer == "sgd") {
      opt = std::make_unique<gw::optim::SGD>(model->parameters(),
                                             gw::optim::SGDOptions{.lr = args.lr, .momentum = 0.9});
    } else {
      opt = std::make_unique<gw::optim::Adam>(model->parameters(), gw::optim::AdamOptions{.lr = args.lr});
    }
    std::printf("%s\n%s, lr %g, batch %lld, %lld training samples, %d epochs\n", model->repr().c_str(),
                args.optimizer.c_str(), args.lr, static_cast<long long>(args.batch_size),
                static_cast<long long>(train.size()), args.epochs);

    gw::optim::StepLR schedule(*opt, {.step_size = 1, .gamma = args.lr_decay});
    gw::data::Loader loader(train, {.batch_size = args.batch_size, .seed = args.seed});
    std::vector<double> losses;
    double acc = 0;
    for (int epoch = 0; epoch < args.epochs; ++epoch) {
      gw::examples::ProgressBar bar("epoch " + std::to_string(epoch + 1), loader.num_batches());
      int64_t seen = 0;
      for (int64_t b = 0; b < loader.num_batches(); ++b) {
        auto [x, y] = loader.batch(epoch, b);
        opt->zero_grad();
        gw::Tensor loss = gw::nn::functional::cross_entropy(model->forward(gw::examples::shape_input(x, args.model)), y);
        loss.backward();
        opt->step();
        losses.push_back(loss.item<double>());
        seen += y.numel();
        bar.update(b + 1, losses.back(), seen);
      }
      bar.finish();
      acc = gw::examples::test_accuracy(*model, test, args.model);
      std::printf("epoch %d: test accuracy %.2f%% (lr %g)\n", epoch + 1, acc * 100, opt->lr());
      schedule.step();
    }
    if (!args.save.empty()) {
      model->save(args.save);
      std::printf("saved the model to %s\n", args.save.c_str());
    }
    if (!args.curve.empty()) {
      gw::examples::write_loss_curve(args.curve, losses, "Fashion-MNIST " + args.model + " loss");
      std::printf("wrote %s.csv and %s.svg\n", args.curve.c_str(), args.curve.c_str());
    }
    return 0;
  } catch (const gw::Error& e) {
    std::fprintf(stderr, "mnist_train: %s\n", e.what());
    return 1;
  }
}
