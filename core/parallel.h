// CPU parallelism for kernels. One process-wide pool sized by set_num_threads (default 1, so
// that ranks launched side by side do not oversubscribe the machine). parallel_for splits
// [begin, end) into contiguous chunks of at least `grain` and runs them on the pool and the
// calling thread; with one thread or a small range it just calls f(begin, end).
#pragma once

#include <cstdint>
#include <functional>

namespace gw {

void set_num_threads(int n);
int get_num_threads();

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& f);

}  // namespace gw
