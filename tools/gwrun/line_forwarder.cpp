// Line reassembly and prefixing for worker output.
#include "tools/gwrun/line_forwarder.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace gw::gwrun {

LineForwarder::LineForwarder(int source_fd, int target_fd, std::string prefix)
    : source_fd_(source_fd), target_fd_(target_fd), prefix_(std::move(prefix)) {}

LineForwarder::LineForwarder(LineForwarder&& other) noexcept
    : source_fd_(std::exchange(other.source_fd_, -1)),
      target_fd_(other.target_fd_),
      prefix_(std::move(other.prefix_)),
      partial_(std::move(other.partial_)) {}

LineForwarder::~LineForwarder() {
  if (source_fd_ >= 0) ::close(source_fd_);
}

void LineForwarder::pump(bool until_empty) {
  char buffer[1 << 16];
  while (source_fd_ >= 0) {
    ssize_t n = ::read(source_fd_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      close_source();
      return;
    }
    forward(std::string_view(buffer, static_cast<size_t>(n)));
    if (!until_empty) return;
  }
}

void LineForwarder::forward(std::string_view data) {
  size_t last_newline = data.rfind('\n');
  if (last_newline == std::string_view::npos) {
    partial_.append(data);  // searching only the new bytes keeps long lines linear
    return;
  }
  partial_.append(data.substr(0, last_newline + 1));
  std::string out;
  out.reserve(partial_.size() + prefix_.size() * 8);
  for (size_t begin = 0; begin < partial_.size();) {
    size_t end = partial_.find('\n', begin) + 1;
    out.append(prefix_).append(partial_, begin, end - begin);
    begin = end;
  }
  // One write per chunk, from one thread: another worker's line can never land mid-line.
  write_all(target_fd_, out);
  partial_.assign(data.substr(last_newline + 1));
}

void LineForwarder::close_source() {
  if (!partial_.empty()) {
    write_all(target_fd_, prefix_ + partial_ + "\n");
    partial_.clear();
  }
  ::close(source_fd_);
  source_fd_ = -1;
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd writable{fd, POLLOUT, 0};
      ::poll(&writable, 1, -1);
    } else if (errno != EINTR) {
      return;
    }
  }
}

}  // namespace gw::gwrun
