// The precompiled header of every layer library (meson's `cpp_pch`): the standard headers most
// of their files include and the tensor header, parsed once per library instead of once per
// file, which builds the layers in two thirds of the time. Each file still includes what it
// uses: `meson configure build -Db_pch=false` builds without it, and shows a missing include.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
