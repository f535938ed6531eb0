#include "examples/common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"

namespace gw::examples {

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 1)),
      tty_(isatty(STDOUT_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t done, double loss, int64_t samples) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? samples / secs : 0;
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  if (tty_) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(frac * kWidth);
    std::printf("\r%s [%s%s] %3d%% loss %.4f  %.0f %s/s ", label_.c_str(),
                std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                static_cast<int>(frac * 100), loss, rate, unit_.c_str());
    std::fflush(stdout);
    drawn_ = true;
    return;
  }
  int decile = static_cast<int>(frac * 10);
  if (decile != last_decile_ && decile < 10) {
    last_decile_ = decile;
    std::printf("%s %3d%% loss %.4f  %.0f %s/s\n", label_.c_str(), decile * 10, loss, rate,
                unit_.c_str());
    std::fflush(stdout);
  }
}

void ProgressBar::print(const std::string& line) {
  finish();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void ProgressBar::finish() {
  if (drawn_) std::printf("\n");
  drawn_ = false;
}

void write_loss_curve(const std::string& prefix, const std::vector<double>& losses,
                      const std::string& title, const std::vector<LossPoint>& validation,
                      int64_t first_step) {
  std::ofstream csv(prefix + ".csv");
  GW_CHECK(csv.good(), IoError, "[write_loss_curve] cannot write ", prefix, ".csv");
  csv << (validation.empty() ? "step,loss\n" : "step,loss,val_loss\n");
  auto val = validation.begin();
  for (size_t i = 0; i < losses.size(); ++i) {
    const int64_t step = first_step + static_cast<int64_t>(i);
    csv << step << "," << losses[i];
    if (!validation.empty()) {
      while (val != validation.end() && val->step < step) ++val;
      csv << ",";
      if (val != validation.end() && val->step == step) csv << val->loss;
    }
    csv << "\n";
  }

  // Plot a moving average so the trend reads through the minibatch noise.
  const size_t n = losses.size(), window = std::max<size_t>(1, n / 100);
  std::vector<double> smooth(n);
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += losses[i];
    if (i >= window) acc -= losses[i - window];
    smooth[i] = acc / static_cast<double>(std::min(i + 1, window));
  }
  double hi = n ? *std::max_element(smooth.begin(), smooth.end()) : 1;
  for (const LossPoint& p : validation) hi = std::max(hi, p.loss);
  hi = hi > 0 ? hi : 1;
  constexpr double W = 640, H = 360, L = 60, B = 40, T = 30, R = 20;
  std::ofstream svg(prefix + ".svg");
  GW_CHECK(svg.good(), IoError, "[write_loss_curve] cannot write ", prefix, ".svg");
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << W / 2 << "' y='18' text-anchor='middle'>" << title << "</text>\n"
      << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B
      << "' stroke='black'/>\n"
      << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B
      << "' stroke='black'/>\n";
  for (int k = 0; k <= 4; ++k) {  // y ticks
    double v = hi * k / 4, y = H - B - (H - B - T) * k / 4;
    svg << "<text x='" << L - 6 << "' y='" << y + 4 << "' text-anchor='end'>" << std::round(v * 100) / 100
        << "</text>\n";
  }
  svg << "<text x='" << (W + L) / 2 << "' y='" << H - 8 << "' text-anchor='middle'>step (" << n
      << " total)</text>\n<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='";
  auto x_of = [&](double step) {
    return L + (W - L - R) * (n > 1 ? step / static_cast<double>(n - 1) : 0);
  };
  auto y_of = [&](double loss) { return H - B - (H - B - T) * loss / hi; };
  for (size_t i = 0; i < n; ++i)
    svg << x_of(static_cast<double>(i)) << "," << y_of(smooth[i]) << " ";
  svg << "'/>\n";
  if (!validation.empty()) {
    svg << "<polyline fill='none' stroke='#ff7f0e' stroke-width='2' points='";
    for (const LossPoint& p : validation)
      svg << x_of(static_cast<double>(p.step - first_step)) << "," << y_of(p.loss) << " ";
    svg << "'/>\n<text x='" << W - R << "' y='" << T + 12 << "' text-anchor='end' fill='#1f77b4'>"
        << "training (moving average)</text>\n<text x='" << W - R << "' y='" << T + 28
        << "' text-anchor='end' fill='#ff7f0e'>validation</text>\n";
  }
  svg << "</svg>\n";
}

}  // namespace gw::examples
