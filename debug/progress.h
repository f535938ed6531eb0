// gw::debug::ProgressFile — two counters a worker and its launcher share through a file:
// operations the worker's flight recorder saw start, and those it saw finish.
//
// gwrun creates one file per local worker and names it in the worker's GW_PROGRESS_FILE; the
// worker maps it and counts (two relaxed atomic adds per operation); gwrun reads it every
// 250 ms. A job whose counters have not moved for --debug-on-timeout seconds while an
// operation is pending has stalled (supervisor.h).
//
//   auto file = gw::debug::ProgressFile::create(dir + "/progress.0");   // gwrun
//   auto mine = gw::debug::ProgressFile::open(getenv("GW_PROGRESS_FILE"));  // the worker
//   mine->started();  ...  mine->finished();
//   gw::debug::ProgressCounts now = file->read();
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace gw::debug {

struct ProgressCounts {
  uint64_t started = 0;
  uint64_t finished = 0;
  bool operator==(const ProgressCounts&) const = default;
  bool pending() const { return started > finished; }
};

class ProgressFile {
 public:
  // Creates (or empties) the file at `path`; throws IoError naming it.
  static std::unique_ptr<ProgressFile> create(const std::string& path);
  // Maps an existing file; throws IoError naming it.
  static std::unique_ptr<ProgressFile> open(const std::string& path);
  ~ProgressFile();
  ProgressFile(const ProgressFile&) = delete;
  ProgressFile& operator=(const ProgressFile&) = delete;

  void started();
  void finished();
  ProgressCounts read() const;

 private:
  explicit ProgressFile(uint64_t* counters) : counters_(counters) {}
  uint64_t* counters_;  // [started, finished], shared with the other process
};

}  // namespace gw::debug
