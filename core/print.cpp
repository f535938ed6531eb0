// PyTorch-style printing, following torch/_tensor_str.py (default print options: precision 4,
// threshold 1000, 3 edge items, line width 80) so that output can be compared with Python's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace gw {
namespace {

constexpr int64_t kThreshold = 1000;  // more elements than this are summarized with "..."
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;

double half_to_double(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0    ? std::ldexp(mant, -24)
             : exp == 31 ? (mant ? NAN : INFINITY)
                         : std::ldexp(mant + 1024, exp - 25);
  return (h >> 15) ? -v : v;
}

double bfloat16_to_double(uint16_t b) {
  uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Python's str() of a float in fixed, scientific or integer style ("nan"/"inf" regardless of
// the sign bit and style, as Python prints them).
std::string fmt(const char* spec, double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

class Printer {
 public:
  explicit Printer(const Tensor& t) : t_(t.to(kCPU).contiguous()) {
    base_ = static_cast<const uint8_t*>(t_.raw_data());
    strides_ = contiguous_strides(t_.sizes());
    summarize_ = t_.numel() > kThreshold;
    floating_ = t_.is_floating_point();
    init_formatter();
  }

  // The body between "tensor(" and the suffixes; `indent` is the column it starts at.
  std::string body(int64_t dim, int64_t offset, int64_t indent) const {
    int64_t ndim = t_.dim();
    if (ndim == 0) return format(0);
    int64_t n = t_.size(dim);
    bool skip = summarize_ && n > 2 * kEdgeItems;
    std::vector<std::string> parts;
    for (int64_t i = 0; i < n; ++i) {
      if (skip && i == kEdgeItems) {
        parts.push_back(dim == ndim - 1 ? " ..." : "...");
        i = n - kEdgeItems - 1;
        continue;
      }
      int64_t at = offset + i * strides_[dim];
      parts.push_back(dim == ndim - 1 ? format(at) : body(dim + 1, at, indent + 1));
    }
    if (dim < ndim - 1) {
      std::string sep = "," + std::string(ndim - dim - 1, '\n') + std::string(indent + 1, ' ');
      return "[" + join(parts, 0, parts.size(), sep) + "]";
    }
    // A row wraps after as many elements as fit in the line width.
    auto per_line = static_cast<size_t>(
        std::max<double>(1, std::floor(double(kLineWidth - indent) / double(max_width_ + 2))));
    std::vector<std::string> lines;
    for (size_t i = 0; i < parts.size(); i += per_line) {
      lines.push_back(join(parts, i, std::min(parts.size(), i + per_line), ", "));
    }
    return "[" + join(lines, 0, lines.size(), ",\n" + std::string(indent + 1, ' ')) + "]";
  }

 private:
  // Calls f on the flat index of every element that will be printed.
  template <typename F>
  void visit(int64_t dim, int64_t offset, F&& f) const {
    if (dim == t_.dim()) return f(offset);
    int64_t n = t_.size(dim);
    for (int64_t i = 0; i < n; ++i) {
      if (summarize_ && n > 2 * kEdgeItems && i == kEdgeItems) i = n - kEdgeItems;
      visit(dim + 1, offset + i * strides_[dim], f);
    }
  }

  const uint8_t* at(int64_t i) const { return base_ + i * t_.element_size(); }

  double value(int64_t i) const {
    DType d = t_.dtype();
    if (d == kFloat16) return half_to_double(load<uint16_t>(at(i)));
    if (d == kBFloat16) return bfloat16_to_double(load<uint16_t>(at(i)));
    if (d == kFloat32) return load<float>(at(i));
    if (d == kFloat64) return load<double>(at(i));
    return static_cast<double>(integer(i));
  }

  int64_t integer(int64_t i) const {  // bool, int32 or int64
    DType d = t_.dtype();
    return d == kInt64 ? load<int64_t>(at(i)) : d == kInt32 ? load<int32_t>(at(i)) : *at(i) != 0;
  }

  // The element without padding.
  std::string raw(int64_t i) const {
    if (t_.dtype() == kBool) return *at(i) ? "True" : "False";
    if (!floating_) return std::to_string(integer(i));
    double v = value(i);
    if (sci_mode_) return fmt("%.4e", v);
    if (int_mode_) return std::isfinite(v) ? fmt("%.0f", v) + "." : fmt("%.0f", v);
    return fmt("%.4f", v);
  }

  std::string format(int64_t i) const {
    std::string s = raw(i);
    return std::string(std::max<int64_t>(0, max_width_ - int64_t(s.size())), ' ') + s;
  }

  // torch._tensor_str._Formatter: pick integer, fixed or scientific style and the column width.
  void init_formatter() {
    if (!floating_) {
      visit(0, 0, [&](int64_t i) { max_width_ = std::max<int64_t>(max_width_, raw(i).size()); });
      return;
    }
    std::vector<double> vals;
    visit(0, 0, [&](int64_t i) {
      double v = value(i);
      if (std::isfinite(v) && v != 0) vals.push_back(v);
    });
    if (vals.empty()) return;
    double lo = INFINITY, hi = 0;
    for (double v : vals) {
      lo = std::min(lo, std::abs(v));
      hi = std::max(hi, std::abs(v));
      if (v != std::ceil(v)) int_mode_ = false;
    }
    sci_mode_ = hi / lo > 1000. || hi > 1e8 || (!int_mode_ && lo < 1e-4);
    for (double v : vals) {
      int64_t w = sci_mode_   ? fmt("%.4e", v).size()
                  : int_mode_ ? fmt("%.0f", v).size() + 1
                              : fmt("%.4f", v).size();
      max_width_ = std::max(max_width_, w);
    }
  }

  static std::string join(const std::vector<std::string>& v, size_t b, size_t e,
                          const std::string& sep) {
    std::string out;
    for (size_t i = b; i < e; ++i) out += (i > b ? sep : "") + v[i];
    return out;
  }

  Tensor t_;
  const uint8_t* base_ = nullptr;
  Shape strides_;
  bool summarize_ = false, floating_ = false, int_mode_ = true, sci_mode_ = false;
  int64_t max_width_ = 1;
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const auto indent = static_cast<int64_t>(prefix.size());
  std::vector<std::string> suffixes;
  if (!device().is_cpu()) suffixes.push_back("device='" + device().str() + "'");
  std::string body;
  if (numel() == 0) {
    // Like PyTorch: an empty tensor shows its shape (unless 1-D) and any non-float32 dtype.
    if (dim() != 1) {
      std::string s = "size=(";
      for (int64_t i = 0; i < dim(); ++i) s += (i ? ", " : "") + std::to_string(size(i));
      suffixes.push_back(s + ")");
    }
    if (dtype() != kFloat32) suffixes.push_back(detail::str("dtype=", dtype()));
    body = "[]";
  } else {
    if (dtype() != kFloat32 && dtype() != kInt64 && dtype() != kBool) {
      suffixes.push_back(detail::str("dtype=", dtype()));
    }
    body = Printer(*this).body(0, 0, indent);
  }
  if (requires_grad()) suffixes.push_back("requires_grad=True");

  // torch._tensor_str._add_suffixes: a suffix that would pass the line width starts a new line.
  std::string out = prefix + body;
  auto nl = out.rfind('\n');
  int64_t last_line = int64_t(out.size()) - (nl == std::string::npos ? -1 : int64_t(nl)) + 1;
  for (const std::string& s : suffixes) {
    auto len = static_cast<int64_t>(s.size());
    if (last_line + len + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + s;
      last_line = indent + len;
    } else {
      out += ", " + s;
      last_line += len + 2;
    }
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace gw
