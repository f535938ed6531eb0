// Terminal progress bar and loss curve output shared by the example trainers.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gw::examples {

// A one-line bar redrawn in place on a terminal; on a pipe (CI logs) it prints a line every
// 10% instead of flooding the log.
class ProgressBar {
 public:
  // `unit` names what update() counts: the readout shows "<rate> <unit>/s".
  ProgressBar(std::string label, int64_t total, std::string unit = "samples");
  // Advances to `done` steps; `loss` and `samples` (processed so far) feed the readout.
  void update(int64_t done, double loss, int64_t samples);
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// A loss measured at some steps, e.g. on the validation split.
struct LossPoint {
  int64_t step;
  double loss;
};

// Writes step,loss rows to `<prefix>.csv` and a line chart to `<prefix>.svg`; with
// `validation`, a val_loss column and a second line, each point at the index of the training
// loss it was measured after.
void write_loss_curve(const std::string& prefix, const std::vector<double>& losses,
                      const std::string& title, const std::vector<LossPoint>& validation = {});

}  // namespace gw::examples
