#include "store/socket_stream.h"

namespace gw::store {

Stream::Stream(asio::ip::tcp::socket socket, TlsContext tls)
    : plain_(socket.get_executor()), context_(std::move(tls)) {
  if (context_)
    tls_.emplace(std::move(socket), *context_);
  else
    plain_ = std::move(socket);
}

void Stream::async_tls_handshake(asio::ssl::stream_base::handshake_type side,
                                 std::function<void(const std::error_code&)> done) {
  if (!tls_) return asio::post(get_executor(), [done = std::move(done)] { done({}); });
  tls_->async_handshake(side, std::move(done));
}

Stream::Binding Stream::channel_binding() {
  return tls_ ? tls_channel_binding(tls_->native_handle()) : Binding{};
}

}  // namespace gw::store
