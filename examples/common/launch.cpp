#include "examples/common/launch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/trace.h"

namespace gw::examples {

store::LaunchEnv launch_env(const char* program) {
  try {
    return store::detect_launch_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    std::exit(2);
  }
}

TrainArgs parse_train_args(const char* program, int argc, char** argv, TrainArgs defaults,
                           const ExtraFlags& extra, const char* extra_usage) {
  TrainArgs a = defaults;
  bool ok = (argc - 1) % 2 == 0;  // every flag takes a value
  for (int i = 1; ok && i + 1 < argc; i += 2) {
    const std::string k = argv[i], value = argv[i + 1];
    const double v = std::atof(value.c_str());
    if (k == "--epochs") a.epochs = static_cast<int64_t>(v);
    else if (k == "--batch-size") a.batch_size = static_cast<int64_t>(v);
    else if (k == "--lr") a.lr = v;
    else if (k == "--limit") a.limit = static_cast<int64_t>(v);
    else if (k == "--target") a.target = v;
    else ok = extra && extra(k, value);
  }
  if (!ok) {
    std::fprintf(stderr, "usage: %s [--epochs N] [--batch-size N] [--lr X] [--limit N] "
                         "[--target ACCURACY]%s\n", program, extra_usage);
    std::exit(2);
  }
  return a;
}

bool TraceArgs::parse(const std::string& flag, const std::string& value) {
  if (flag != "--trace" || value.empty()) return false;
  path = value;
  return true;
}

void TraceArgs::start() {
  if (path.empty()) return;
  started = std::filesystem::file_time_type::clock::now();
  trace::start(path);
}

void TraceArgs::finish(int rank, int world_size) const {
  if (path.empty()) return;
  trace::stop();
  if (rank != 0) return;
  std::vector<std::string> parts;
  for (int r = 0; r < world_size; ++r)
    parts.push_back(path + ".rank" + std::to_string(r) + ".json");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  auto written = [&](const std::string& part) {  // whole: written aside, then renamed
    std::error_code ec;
    return std::filesystem::last_write_time(part, ec) >= started && !ec;
  };
  std::vector<std::string> here;  // another host's parts are not here: merged without them
  for (const auto& part : parts) {
    while (!written(part) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (written(part)) here.push_back(part);
  }
  trace::merge(here, path);
  std::printf("trace of %zu of %d ranks written to %s: open it at https://ui.perfetto.dev\n",
              here.size(), world_size, path.c_str());
}

bool CheckpointArgs::parse(const std::string& flag, const std::string& value) {
  if (flag == "--checkpoint-every" && std::atoll(value.c_str()) > 0) {
    every = std::atoll(value.c_str());
    return true;
  }
  if (flag == "--checkpoint-dir" && !value.empty()) {
    dir = value;
    return true;
  }
  return false;
}

std::optional<Checkpoint> CheckpointArgs::load(bool report) const {
  if (every == 0) return std::nullopt;
  auto c = load_checkpoint(dir);
  if (c && report)
    std::printf("resuming from %s at epoch %lld, step %lld\n", dir.c_str(),
                static_cast<long long>(c->epoch + 1), static_cast<long long>(c->step));
  return c;
}

void CheckpointArgs::save(const Checkpoint& c) const {
  save_checkpoint(dir, c);
  std::printf("checkpoint saved: epoch %lld, step %lld\n", static_cast<long long>(c.epoch + 1),
              static_cast<long long>(c.step));
  std::fflush(stdout);
}

}  // namespace gw::examples
