// The self-pipe behind SignalPipe.
#include "tools/gwrun/signal_pipe.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace gw::gwrun {
namespace {

// A signal handler can only reach globals; there is one SignalPipe per process.
int g_write_fd = -1;
struct sigaction g_previous[NSIG];

void on_signal(int sig) {
  int saved_errno = errno;  // the interrupted code may be about to read errno
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_write_fd, &byte, 1);  // a full pipe already wakes poll()
  (void)ignored;
  errno = saved_errno;
}

}  // namespace

const std::vector<int>& SignalPipe::handled_signals() {
  static const std::vector<int> signals{SIGINT, SIGTERM, SIGCHLD, SIGPIPE};
  return signals;
}

SignalPipe::SignalPipe() {
  GW_CHECK(g_write_fd < 0, StateError, "[gwrun] a SignalPipe already exists");
  int fds[2];
  GW_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, IoError,
           "[gwrun] pipe2 failed: ", std::strerror(errno));
  read_fd_ = fds[0];
  g_write_fd = fds[1];
  for (int sig : handled_signals()) {
    struct sigaction action {};
    action.sa_handler = sig == SIGPIPE ? SIG_IGN : on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(sig, &action, &g_previous[sig]);
  }
}

SignalPipe::~SignalPipe() {
  for (int sig : handled_signals()) ::sigaction(sig, &g_previous[sig], nullptr);
  ::close(read_fd_);
  ::close(g_write_fd);
  g_write_fd = -1;
}

std::vector<int> SignalPipe::take() {
  std::vector<int> signals;
  unsigned char bytes[64];
  ssize_t n;
  while ((n = ::read(read_fd_, bytes, sizeof bytes)) > 0 || (n < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < n; ++i) signals.push_back(bytes[i]);
  }
  return signals;
}

}  // namespace gw::gwrun
