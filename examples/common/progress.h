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
  // Prints `line` (and a newline) on a line of its own; on a terminal the bar is drawn again
  // below it at the next update.
  void print(const std::string& line);
  // Ends the bar's line (once).
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  bool tty_;
  bool drawn_ = false;  // on a terminal: the bar is on the current line
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// A loss measured after some step, e.g. on the validation split.
struct LossPoint {
  int64_t step;  // counted as the training losses' steps (first_step below)
  double loss;
};

// Writes step,loss rows to `<prefix>.csv` and a line chart to `<prefix>.svg`. losses[i] is
// step first_step + i's. With `validation`, a val_loss column (empty where there is none) and
// a second line, each point at its step.
void write_loss_curve(const std::string& prefix, const std::vector<double>& losses,
                      const std::string& title, const std::vector<LossPoint>& validation = {},
                      int64_t first_step = 0);

}  // namespace gw::examples
