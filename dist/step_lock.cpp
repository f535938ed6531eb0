#include "dist/step_lock.h"

namespace gw::dist {

std::mutex& optimizer_step_lock() {
  static std::mutex mu;
  return mu;
}

}  // namespace gw::dist
