#include "debug/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace gw::debug {

namespace {
constexpr size_t kBytes = 2 * sizeof(uint64_t);

uint64_t* map_file(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
  GW_CHECK(fd >= 0, IoError, "[progress file] cannot open ", path, ": ", std::strerror(errno));
  if ((flags & O_CREAT) != 0 && ::ftruncate(fd, kBytes) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError(gw::detail::str("[progress file] cannot size ", path, ": ", std::strerror(err)));
  }
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  GW_CHECK(p != MAP_FAILED, IoError, "[progress file] cannot map ", path, ": ", std::strerror(err));
  return static_cast<uint64_t*>(p);
}
}  // namespace

std::unique_ptr<ProgressFile> ProgressFile::create(const std::string& path) {
  return std::unique_ptr<ProgressFile>(
      new ProgressFile(map_file(path, O_RDWR | O_CREAT | O_TRUNC)));
}

std::unique_ptr<ProgressFile> ProgressFile::open(const std::string& path) {
  return std::unique_ptr<ProgressFile>(new ProgressFile(map_file(path, O_RDWR)));
}

ProgressFile::~ProgressFile() { ::munmap(counters_, kBytes); }

void ProgressFile::started() {
  std::atomic_ref<uint64_t>(counters_[0]).fetch_add(1, std::memory_order_relaxed);
}
void ProgressFile::finished() {  // after its started(): release orders the two for read()
  std::atomic_ref<uint64_t>(counters_[1]).fetch_add(1, std::memory_order_release);
}

ProgressCounts ProgressFile::read() const {
  // finished first: a reader never sees more finished than started.
  const uint64_t finished = std::atomic_ref<uint64_t>(counters_[1]).load(std::memory_order_acquire);
  const uint64_t started = std::atomic_ref<uint64_t>(counters_[0]).load(std::memory_order_acquire);
  return {started, finished};
}

}  // namespace gw::debug
