// A process that speaks the RPC wire protocol by hand, for the tests of what a worker accepts
// from a peer that is not the one it called:
//   rpc_impostor <host> <port> <worker name> <worker id> <first call id> <last call id>
// connects to the worker at host:port, completes a handshake claiming to be the given worker,
// sends a forged response (the value -666) for every call id in [first, last], then asks the
// builtin min(1, 2) on the same connection and waits for its answer: the worker reads a
// connection's frames in order, so once that answer is here every forged response has been
// handled. Exits 0 when the answer is 1; every read gives up after 10 s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "core/ops.h"
#include "rpc/message.h"

using namespace gw;
using namespace gw::rpc;

namespace {
void write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw IoError(std::string("send: ") + std::strerror(errno));
    p += w, n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw IoError(r == 0 ? "the worker closed the connection" : std::strerror(errno));
    p += r, n -= static_cast<size_t>(r);
  }
}

void send_message(int fd, const Message& m) {
  OutgoingFrame f = encode(m);
  write_all(fd, f.prefix.data(), f.prefix.size());
  write_all(fd, reinterpret_cast<const uint8_t*>(f.header.begin()),
            f.header.size() * sizeof(capnp::word));
  for (const Tensor& t : f.tensors)
    write_all(fd, static_cast<const uint8_t*>(t.raw_data()), t.nbytes());
}

Message read_message(int fd) {
  uint8_t prefix[kFramePrefixBytes];
  read_all(fd, prefix, sizeof prefix);
  FramePrefix p = parse_prefix(prefix, uint64_t{1} << 30);
  auto header = kj::heapArray<capnp::word>(p.header_bytes / sizeof(capnp::word));
  read_all(fd, reinterpret_cast<uint8_t*>(header.begin()), p.header_bytes);
  std::vector<Tensor> tensors;
  for (auto& l : tensor_layouts(header.asPtr(), p.payload_bytes)) {
    Tensor t = empty(l.sizes, l.dtype);
    read_all(fd, static_cast<uint8_t*>(t.raw_data()), l.nbytes);
    tensors.push_back(t);
  }
  return decode(header.asPtr(), std::move(tensors));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: rpc_impostor <host> <port> <name> <id> <first call id> <last call id>\n";
    return 2;
  }
  try {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval limit{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[2])));
    GW_CHECK(::inet_pton(AF_INET, argv[1], &addr.sin_addr) == 1, InvalidArgumentError,
             "bad address ", argv[1]);
    GW_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, IoError,
             "connect: ", std::strerror(errno));

    Message hello;
    hello.body = Handshake{kProtocolVersion, argv[3], std::atoi(argv[4])};
    send_message(fd, hello);
    for (uint64_t id = std::strtoull(argv[5], nullptr, 10);
         id <= std::strtoull(argv[6], nullptr, 10); ++id) {
      Message forged;
      forged.id = id;
      forged.body = Response{IValue(int64_t{-666}), std::nullopt};
      send_message(fd, forged);
    }
    Message ask;
    ask.id = 1;
    ask.body = Request(Call{"min", {IValue(int64_t{1}), IValue(int64_t{2})}});
    send_message(fd, ask);
    for (int frames = 0; frames < 100; ++frames) {
      Message m = read_message(fd);
      const Response* r = m.get<Response>();
      if (r == nullptr || m.id != 1) continue;
      GW_CHECK(!r->error, IoError, "min(1, 2) failed: ", r->error->message);
      GW_CHECK(r->value.to_int() == 1, IoError, "min(1, 2) answered ", r->value.to_int());
      ::close(fd);
      return 0;
    }
    throw IoError("no answer to min(1, 2) among 100 frames");
  } catch (const std::exception& e) {
    std::cerr << "rpc_impostor: " << e.what() << "\n";
    return 1;
  }
}
