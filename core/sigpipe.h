// gw::SigpipeBlocked: no SIGPIPE from the writes of a library that cannot pass MSG_NOSIGNAL.
//
// A write to a socket whose peer is gone raises SIGPIPE, whose default action kills the
// process. Gloo's sockets and OpenSSL's socket BIO write without MSG_NOSIGNAL. While a
// SigpipeBlocked lives, SIGPIPE is blocked on this thread (threads started meanwhile inherit
// the mask), and one raised meanwhile is consumed before the mask is restored, so the write
// fails with EPIPE instead and the caller reports it.
//
//   { SigpipeBlocked no_sigpipe; SSL_write(ssl, data, n); }
#pragma once

#include <pthread.h>

#include <csignal>
#include <ctime>

namespace gw {

class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~SigpipeBlocked() {
    if (sigismember(&previous_, SIGPIPE)) return;  // blocked by the caller: leave it pending
    sigset_t pending;
    sigpending(&pending);
    const timespec now{0, 0};
    if (sigismember(&pending, SIGPIPE)) sigtimedwait(&pipe_, nullptr, &now);
    pthread_sigmask(SIG_UNBLOCK, &pipe_, nullptr);  // only SIGPIPE: the rest may have changed
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_, previous_;
};

}  // namespace gw
