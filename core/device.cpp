#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace gw {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return kCPU;
  if (text.starts_with("cuda")) {
    std::string_view rest = text.substr(4);
    if (rest.empty()) return cuda_device(0);
    int index = -1;
    if (rest.front() == ':') {
      auto [end, ec] = std::from_chars(rest.data() + 1, rest.data() + rest.size(), index);
      if (ec == std::errc() && end == rest.data() + rest.size() && index >= 0) {
        return cuda_device(index);
      }
    }
  }
  throw InvalidArgumentError(detail::str("[Device] cannot parse device \"", text,
                                         "\" (expected \"cpu\", \"cuda\" or \"cuda:N\")"));
}

std::string Device::str() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace gw
