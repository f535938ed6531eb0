#include "examples/common/launch.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace gw::examples {

int env_int(const char* program, const char* name) {
  const char* v = std::getenv(name);
  if (!v) {
    std::fprintf(stderr, "%s: %s is not set; run me under gwrun\n", program, name);
    std::exit(2);
  }
  return std::atoi(v);
}

TrainArgs parse_train_args(const char* program, int argc, char** argv) {
  TrainArgs a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    const double v = i + 1 < argc ? std::atof(argv[i + 1]) : 0;
    if (i + 1 < argc && k == "--epochs") a.epochs = static_cast<int64_t>(v);
    else if (i + 1 < argc && k == "--batch-size") a.batch_size = static_cast<int64_t>(v);
    else if (i + 1 < argc && k == "--lr") a.lr = v;
    else if (i + 1 < argc && k == "--limit") a.limit = static_cast<int64_t>(v);
    else if (i + 1 < argc && k == "--target") a.target = v;
    else {
      std::fprintf(stderr, "usage: %s [--epochs N] [--batch-size N] [--lr X] [--limit N] "
                           "[--target ACCURACY]\n", program);
      std::exit(2);
    }
  }
  return a;
}

}  // namespace gw::examples
