#include "store/tls.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <asio/ssl.hpp>

#include "core/error.h"
#include "core/sigpipe.h"

namespace gw::store {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The oldest error OpenSSL queued on this thread (and clears the rest), or `fallback`.
std::string openssl_error(const std::string& fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

// Private key bytes, wiped when they go.
struct SecretText {
  std::string text;
  ~SecretText() { OPENSSL_cleanse(text.data(), text.size()); }
};

// The contents of the private key file `path`, checked private on the descriptor they are read
// from (no window for the file to change between the check and the read).
void read_private_file(const std::string& path, const char* op, SecretText& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
  GW_CHECK(fd >= 0, InvalidArgumentError, "[", op, "] cannot read TLS key file '", path,
           "': ", std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0)
    problem = std::string("cannot be examined: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode) || st.st_size > (1 << 20))
    problem = "is not a regular file of at most 1 MiB";
  else if ((st.st_mode & 077) != 0)
    problem = "may be read or written by group or others: make it private with chmod 600";
  for (size_t got = 0; problem.empty();) {  // bounded: at most st_size bytes
    out.text.resize(static_cast<size_t>(st.st_size));
    const ssize_t n = ::read(fd, out.text.data() + got, out.text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) problem = std::string("cannot be read: ") + std::strerror(errno);
    if (n <= 0) {
      out.text.resize(got);
      break;
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (problem.empty() && out.text.empty()) problem = "is empty";
  GW_CHECK(problem.empty(), InvalidArgumentError, "[", op, "] TLS key file '", path, "' ", problem);
}

}  // namespace

TlsContext make_tls_context(const TlsOptions& given, const char* op) {
  TlsOptions o = given;
  const char* source = "options";
  if (!o.enabled()) {
    o = {env_or_empty(kTlsCertEnv), env_or_empty(kTlsKeyEnv), env_or_empty(kTlsCaEnv)};
    source = "environment";
    if (!o.enabled()) return nullptr;
  }
  GW_CHECK(!o.cert_file.empty() && !o.key_file.empty() && !o.ca_file.empty(), InvalidArgumentError,
           "[", op, "] TLS needs a certificate, its key and the job's CA; ", "the ", source,
           " give cert_file '", o.cert_file, "', key_file '", o.key_file, "', ca_file '", o.ca_file,
           "' (", kTlsCertEnv, ", ", kTlsKeyEnv, ", ", kTlsCaEnv, ")");
  SecretText key;
  read_private_file(o.key_file, op, key);

  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX* native = ctx->native_handle();
  auto load = [&](const char* what, const std::string& file, auto&& step) {
    ERR_clear_error();
    std::error_code ec;
    step(ec);
    GW_CHECK(!ec, InvalidArgumentError, "[", op, "] cannot use ", what, " '", file,
             "': ", openssl_error(ec.message()));
  };
  load("TLS certificate", o.cert_file,
       [&](std::error_code& ec) { ctx->use_certificate_chain_file(o.cert_file, ec); });
  // (OpenSSL also checks here that the key is the certificate's.)
  load("TLS key", o.key_file, [&](std::error_code& ec) {
    ctx->use_private_key(asio::buffer(key.text), asio::ssl::context::pem, ec);
  });
  load("TLS CA file", o.ca_file,
       [&](std::error_code& ec) { ctx->load_verify_file(o.ca_file, ec); });
  // Mutual TLS 1.3 only, AES-GCM first (AES-NI); no session tickets (nothing resumes).
  SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(native,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_num_tickets(native, 0);
  SSL_CTX_set_options(native, SSL_OP_NO_TICKET);
  ctx->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
  return ctx;
}

auth::ChannelBinding tls_channel_binding(ssl_st* ssl) {
  // The exporter label both ends use (RFC 5705: a label not registered with IANA starts
  // with "EXPERIMENTAL"; RFC 8446 section 7.5).
  static constexpr char kLabel[] = "EXPERIMENTAL-gradwire-job-key";
  auth::ChannelBinding out{};
  GW_CHECK(SSL_export_keying_material(ssl, out.data(), out.size(), kLabel, sizeof kLabel - 1,
                                      nullptr, 0, 0) == 1,
           IoError, "[handshake] TLS keying material could not be exported");
  return out;
}

// --- TlsSession -------------------------------------------------------------------------------

TlsSession::TlsSession(const TlsContext& ctx, int fd, const Wait& wait, const std::string& peer,
                       const char* op)
    : ssl_(SSL_new(ctx->native_handle())), peer_(peer) {
  try {
    GW_CHECK(ssl_ != nullptr && SSL_set_fd(ssl_, fd) == 1, IoError, "[", op,
             "] cannot set up TLS: ", openssl_error("out of memory"));
    call(SSL_connect, nullptr, 0, wait, op, "TLS handshake");
  } catch (...) {
    SSL_free(ssl_);
    throw;
  }
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

void TlsSession::write(const uint8_t* data, size_t n, const Wait& wait, const char* op) {
  while (n > 0) {
    const size_t done = call(SSL_write, const_cast<uint8_t*>(data), n, wait, op, "TLS write");
    data += done, n -= done;
  }
}

void TlsSession::read(uint8_t* data, size_t n, const Wait& wait, const char* op) {
  while (n > 0) {
    const size_t done = call(SSL_read, data, n, wait, op, "TLS read");
    data += done, n -= done;
  }
}

template <typename F>
size_t TlsSession::call(F f, uint8_t* data, size_t n, const Wait& wait, const char* op,
                        const char* what) {
  // OpenSSL's socket BIO writes without MSG_NOSIGNAL (a read may write too: an alert).
  SigpipeBlocked no_sigpipe;
  for (;;) {  // bounded by `wait`'s deadline
    ERR_clear_error();
    errno = 0;
    int ret = 0;
    if constexpr (std::is_invocable_v<F, SSL*>)
      ret = f(ssl_);
    else
      ret = f(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    const int call_errno = errno;
    if (ret > 0) return static_cast<size_t>(ret);
    const int err = SSL_get_error(ssl_, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      wait(err == SSL_ERROR_WANT_WRITE);
      continue;
    }
    // The connection ending (cleanly, abruptly or under an error) is a lost connection;
    // anything else is TLS refusing the peer (its certificate, an alert it sent).
    const unsigned long first = ERR_peek_error();
    if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL ||
        (ERR_GET_LIB(first) == ERR_LIB_SSL &&
         ERR_GET_REASON(first) == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
      const std::string why = err == SSL_ERROR_SYSCALL && call_errno != 0
                                  ? std::strerror(call_errno)
                                  : std::string("the peer closed the connection");
      ERR_clear_error();
      // A server refusing our certificate (TLS 1.3 says so after our handshake) may have
      // closed before our write: its alert may be waiting, unread.
      if (!alert_waiting())
        throw IoError(
            gw::detail::str("[", op, "] ", what, ": connection to ", peer_, " lost: ", why));
    }
    std::string why = openssl_error("refused");
    if (const long verify = SSL_get_verify_result(ssl_); verify != X509_V_OK)
      why += gw::detail::str(" (", X509_verify_cert_error_string(verify), ")");
    throw TlsRefusedError(gw::detail::str("[", op, "] ", what, " with ", peer_, " failed: ", why));
  }
}

bool TlsSession::alert_waiting() {
  char byte;
  ERR_clear_error();
  const int r = SSL_peek(ssl_, &byte, 1);  // the socket is non-blocking: never waits
  if (r > 0 || SSL_get_error(ssl_, r) != SSL_ERROR_SSL) return false;
  const unsigned long e = ERR_peek_error();
  return ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) >= SSL_AD_REASON_OFFSET;
}

auth::ChannelBinding TlsSession::channel_binding() const { return tls_channel_binding(ssl_); }

}  // namespace gw::store
