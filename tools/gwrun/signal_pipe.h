// SignalPipe: turns SIGINT, SIGTERM and SIGCHLD into bytes on a pipe (the self-pipe trick),
// so gwrun's single poll() loop sees signals next to worker output.
#pragma once

#include <vector>

namespace gw::gwrun {

class SignalPipe {
 public:
  // Installs the handlers and ignores SIGPIPE (a closed stdout must not kill gwrun).
  SignalPipe();
  ~SignalPipe();  // restores the previous dispositions
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_fd_; }
  // The signals delivered since the last call, in order.
  std::vector<int> take();

  // Signals whose gwrun disposition differs from the default: a child must get them reset.
  static const std::vector<int>& handled_signals();

 private:
  int read_fd_;
};

}  // namespace gw::gwrun
