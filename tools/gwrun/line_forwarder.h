// LineForwarder: copies one worker pipe to gwrun's stdout or stderr a whole line at a time,
// each line prefixed with "[RANK] ".
#pragma once

#include <string>
#include <string_view>

namespace gw::gwrun {

class LineForwarder {
 public:
  // Takes ownership of `source_fd` (the read end of a worker's pipe, non-blocking).
  LineForwarder(int source_fd, int target_fd, std::string prefix);
  LineForwarder(LineForwarder&& other) noexcept;
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;
  LineForwarder& operator=(LineForwarder&&) = delete;
  ~LineForwarder();

  int fd() const { return source_fd_; }
  bool is_open() const { return source_fd_ >= 0; }

  // Reads one chunk (or, with `until_empty`, everything buffered in the pipe) and writes the
  // complete lines. At end of file it writes the unterminated last line and closes the pipe.
  void pump(bool until_empty);

 private:
  void forward(std::string_view data);
  void close_source();

  int source_fd_;
  int target_fd_;
  std::string prefix_;
  std::string partial_;  // bytes after the last newline seen, waiting for the rest of the line
};

// Writes all of `data` to `fd`, retrying on EINTR, short writes and a non-blocking target.
// Gives up silently on other errors: a closed stdout must not stop gwrun supervising.
void write_all(int fd, std::string_view data);

}  // namespace gw::gwrun
