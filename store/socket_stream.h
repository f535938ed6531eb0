// gw::store::Stream: the connection RPC and the TCPStore server speak over — a TCP socket, with
// or without TLS (store/tls.h) on it — as one Asio stream.
//
//   Stream s(asio::ip::tcp::socket(io), make_tls_context(options, "init_rpc"));  // or null
//   s.socket().async_connect(endpoint, ...);
//   s.async_tls_handshake(asio::ssl::stream_base::client, ...);  // at once without TLS
//   asio::async_read(s, asio::buffer(header), ...);
#pragma once

#include <functional>
#include <optional>
#include <system_error>
#include <utility>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "store/job_key.h"
#include "store/tls.h"

namespace gw::store {

// A connected (or connecting) TCP socket, plain or under TLS: an Asio AsyncReadStream and
// AsyncWriteStream. Not thread-safe: one read and one write at a time, from its executor.
class Stream {
 public:
  using executor_type = asio::ip::tcp::socket::executor_type;
  using Binding = auth::ChannelBinding;

  // TLS when `tls` is set; its handshake is async_tls_handshake's.
  explicit Stream(asio::ip::tcp::socket socket, TlsContext tls = nullptr);
  Stream(Stream&&) = default;

  executor_type get_executor() { return socket().get_executor(); }
  // The TCP socket beneath (to connect, set options, close).
  asio::ip::tcp::socket& socket() { return tls_ ? tls_->next_layer() : plain_; }
  const asio::ip::tcp::socket& socket() const { return tls_ ? tls_->next_layer() : plain_; }
  bool is_tls() const { return tls_.has_value(); }
  bool is_open() const { return socket().is_open(); }
  void close(std::error_code& ec) { socket().close(ec); }

  // TLS: runs the handshake as `side` (a failed peer verification is an error). Plain:
  // completes at once. `done` runs on the executor.
  void async_tls_handshake(asio::ssl::stream_base::handshake_type side,
                           std::function<void(const std::error_code&)> done);
  // What binds the job-key handshake to this TLS session (RFC 5705 keying material, the same
  // on both ends of one session); all zeros on a plain stream.
  Binding channel_binding();

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    else
      plain_.async_read_some(buffers, std::forward<Handler>(handler));
  }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    else
      plain_.async_write_some(buffers, std::forward<Handler>(handler));
  }

 private:
  asio::ip::tcp::socket plain_;  // when not TLS (moved into tls_ otherwise)
  TlsContext context_;           // keeps tls_'s context alive
  std::optional<asio::ssl::stream<asio::ip::tcp::socket>> tls_;
};

}  // namespace gw::store
