// Optional TLS for gradwire's connections (RPC and TCPStore): the options, the context made
// from them, and the TLS session of a blocking client.
//
// Mental model: TLS is a layer under the job-key handshake, not a replacement for it. A job
// that must not be read on the wire gives every process the same three PEM files — its own
// certificate and private key, and the job's CA — in the options (TlsOptions) or in the
// environment (GW_TLS_CERT_FILE, GW_TLS_KEY_FILE, GW_TLS_CA_FILE). Each connection then opens
// with a mutual TLS 1.3 handshake (each side's certificate must chain to the CA), and the
// job-key handshake runs inside it, bound to that TLS session (its proofs cover the session's
// exported keying material): a peer relaying the job-key messages between two TLS sessions of
// its own fails them. Host names are not checked: the job's CA and the job key decide who
// belongs. After the handshakes every byte is encrypted and authenticated (AES-GCM, which both
// ends prefer; ChaCha20-Poly1305 is allowed too).
//
//   TlsOptions tls{"node.pem", "node.key", "ca.pem"};
//   TlsContext ctx = make_tls_context(tls, "init_rpc");  // null when TLS is off
//   Stream s(asio::ip::tcp::socket(io), ctx);            // store/socket_stream.h
//
// Asynchronous connections (the RPC agent, the TCPStore server) speak TLS through Stream
// (store/socket_stream.h); the TCPStore client, which blocks with deadlines, through TlsSession.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/error.h"
#include "store/job_key.h"

namespace asio::ssl {
class context;
}
struct ssl_st;  // OpenSSL's SSL

namespace gw::store {

inline constexpr const char* kTlsCertEnv = "GW_TLS_CERT_FILE";
inline constexpr const char* kTlsKeyEnv = "GW_TLS_KEY_FILE";
inline constexpr const char* kTlsCaEnv = "GW_TLS_CA_FILE";

// Where a process's TLS credentials are: all three files, or none (TLS off).
struct TlsOptions {
  std::string cert_file;  // this process's certificate (PEM; a chain is allowed)
  std::string key_file;   // its private key (PEM), readable only by its owner
  std::string ca_file;    // the CA(s) a peer's certificate must chain to (PEM)
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

using TlsContext = std::shared_ptr<asio::ssl::context>;

// The TLS a connection uses: `given` if it names any file, else the GW_TLS_* variables'; null
// when neither does. Throws InvalidArgumentError naming `op` and the files when one of the
// three is missing, a file cannot be read or parsed, the key does not match the certificate,
// or the key file is readable or writable by group or others.
TlsContext make_tls_context(const TlsOptions& given, const char* op);

// What binds the job-key handshake to the TLS session `ssl` (RFC 5705 keying material: the same
// on both ends of one session, different on every other).
auth::ChannelBinding tls_channel_binding(ssl_st* ssl);

// A TLS handshake that failed on its merits — a certificate the other side does not accept,
// an alert it sent — rather than because the connection was lost: trying again cannot help.
class TlsRefusedError : public IoError {
 public:
  explicit TlsRefusedError(const std::string& message)
      : Error(ErrorCode::kIo, message), IoError(message) {}
};

// A blocking client's TLS session over a connected socket (TCPStore's client): drives
// OpenSSL by hand on a non-blocking descriptor, waiting with poll() up to a deadline.
// `wait(want_write)` must wait until the descriptor is readable (writable) or throw.
class TlsSession {
 public:
  using Wait = std::function<void(bool want_write)>;
  // Runs the client handshake. Throws TlsRefusedError when TLS refuses (either side's
  // certificate), IoError when the connection is lost; both name `op` and `peer`. `wait` may
  // throw too (TimeoutError at its deadline).
  TlsSession(const TlsContext& ctx, int fd, const Wait& wait, const std::string& peer,
             const char* op);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Writes all of data; reads exactly n bytes. The peer closing first is an IoError; an alert
  // it sends (such as refusing our certificate, which TLS 1.3 tells after the handshake) a
  // TlsRefusedError.
  void write(const uint8_t* data, size_t n, const Wait& wait, const char* op);
  void read(uint8_t* data, size_t n, const Wait& wait, const char* op);
  auth::ChannelBinding channel_binding() const;

 private:
  // Runs the OpenSSL call `f` (SSL_connect, or SSL_read/SSL_write on data[0, n)) until it makes
  // progress, waiting as it asks; returns the bytes it moved.
  template <typename F>
  size_t call(F f, uint8_t* data, size_t n, const Wait& wait, const char* op, const char* what);

  // Whether the peer sent an alert we have not read yet (leaves it in OpenSSL's error queue).
  bool alert_waiting();

  ssl_st* ssl_ = nullptr;
  std::string peer_;
};

}  // namespace gw::store
