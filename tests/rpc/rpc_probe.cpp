// A process that speaks the RPC wire by hand, for the tests of what a worker accepts from
// whoever can reach its port:
//   rpc_probe <mode> <host> <port> <target name> <target id> <as name> <as id> <key file|->
//             [<first call id> <last call id>]
// connects to worker <target> at host:port claiming to be worker <as>, with the job key in
// <key file> ("-": none), as <mode> says:
//   member    proves the key, sends a forged response (the value -666) for every call id in
//             [first, last], then asks min(1, 2) and waits for the answer (the worker reads a
//             connection's frames in order, so every forged response has been handled by then).
//             Exits 0 when the answer is 1.
//   nokey     skips the handshake: sends a Handshake frame, forged responses and a call of bump.
//   wrongkey  runs the handshake with a random key (ignoring that the worker's proof fails).
//   replay    proves the key on one connection, recording what it sent; on a second, replays
//             those bytes.
//   impostor  proves the key (it is in the job) claiming <as>, which is already connected.
// Every mode above but member then calls bump and forged responses, and exits 0 when the worker
// closes the connection without sending a single frame; 1 if anything came back. Every read
// gives up after 10 s. And two more:
//   flood     opens <first> connections: a third start a handshake and stall, a third claim a
//             896 MiB frame and stall, a third trickle a byte every 50 ms; creates the file
//             <key file> once all are open; exits 0 once the worker has closed every one within
//             <last> ms (1 if not).
//   store     (port: a TCPStore's) without the key, sends set, get and delete requests; exits 0
//             when the store closes the connection without an answer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "rpc/message.h"
#include "store/byte_codec.h"
#include "store/job_key.h"
#include "store/tcp_store_wire.h"

using namespace gw;
using namespace gw::rpc;
namespace auth = gw::store::auth;

namespace {

struct Closed {};  // the worker closed the connection (or reset it)

void write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == ECONNRESET || errno == EPIPE)) throw Closed{};
    if (w <= 0) throw IoError(std::string("send: ") + std::strerror(errno));
    p += w, n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (r < 0 && errno == ECONNRESET)) throw Closed{};
    if (r < 0) throw IoError(std::string("recv: ") + std::strerror(errno));
    p += r, n -= static_cast<size_t>(r);
  }
}

template <size_t N>
void write_array(int fd, const std::array<uint8_t, N>& a) {
  write_all(fd, a.data(), N);
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

int connect_to(const char* host, const char* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval limit{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
  GW_CHECK(::inet_pton(AF_INET, host, &addr.sin_addr) == 1, InvalidArgumentError, "bad address ",
           host);
  GW_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, IoError,
           "connect: ", std::strerror(errno));
  return fd;
}

// The handshake of a client holding `key`; what it sent goes to `hello` and `proof`.
void prove(int fd, const store::JobKey& key, const auth::Identity& self,
           const auth::Identity& target, auth::Hello* hello = nullptr,
           auth::Proof* proof = nullptr) {
  auth::ClientHandshake h(key, auth::Purpose::kRpc, self);
  write_array(fd, h.hello());
  auth::Challenge challenge;
  read_all(fd, challenge.data(), challenge.size());
  const auth::Proof p = h.answer(challenge, target);
  write_array(fd, p);
  if (hello) *hello = h.hello();
  if (proof) *proof = p;
}

void send_forged(int fd, uint64_t first, uint64_t last) {
  for (uint64_t id = first; id <= last; ++id) {
    Message forged;
    forged.id = id;
    forged.body = Response{IValue(int64_t{-666}), std::nullopt};
    send_message(fd, forged);
  }
}

void send_call(int fd, uint64_t id, const std::string& function, IValueList args) {
  Message ask;
  ask.id = id;
  ask.body = Request(Call{function, std::move(args)});
  send_message(fd, ask);
}

}  // namespace

// See "flood" above.
int flood(const char* host, const char* port, int n, const std::string& ready_file,
          std::chrono::milliseconds bound) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> fds;
  const std::array<uint8_t, 4> hello_start = auth::kHelloMagic;
  const std::array<uint8_t, 16> huge{'G', 'W', 'R', '1', 8, 0, 0, 0, 0, 0, 0, 0x38, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    fds.push_back(connect_to(host, port));
    if (i % 3 == 0) ::send(fds.back(), hello_start.data(), 4, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (i % 3 == 1) ::send(fds.back(), huge.data(), huge.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  std::ofstream(ready_file) << "ready\n";
  for (int round = 0; std::chrono::steady_clock::now() - start < bound; ++round) {
    size_t open = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      int& fd = fds[i];
      if (fd < 0) continue;
      uint8_t b = 0;
      const ssize_t r = ::recv(fd, &b, 1, MSG_DONTWAIT);
      bool closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      if (!closed && i % 3 == 2) closed = ::send(fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
      if (closed) {
        ::close(fd);
        fd = -1;
      } else {
        ++open;
      }
    }
    if (open == 0) return 0;
    ::usleep(50 * 1000);  // a slow client's pace
  }
  std::cerr << "rpc_probe: flood: connections still open after " << bound.count() << " ms\n";
  return 1;
}

// A store client without the key: set, get and delete, straight after connecting.
int store_without_key(const char* host, const char* port) {
  namespace d = gw::store::detail;
  const int fd = connect_to(host, port);
  auto frame = [&](d::Command cmd, const std::string& key, const std::string* value) {
    d::ByteWriter w("rpc_probe");
    w.u8(static_cast<uint8_t>(cmd));
    w.str(key);
    if (value) w.bytes(store::Bytes(value->begin(), value->end()));
    if (cmd == d::Command::kGet) w.u64(100);
    const store::Bytes& body = w.buffer();
    const auto n = static_cast<uint32_t>(body.size());
    const uint8_t len[4] = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
    write_all(fd, len, 4);
    write_all(fd, body.data(), body.size());
  };
  try {
    const std::string v = "intruder";
    frame(d::Command::kSet, "intruder", &v);
    frame(d::Command::kGet, "secret", nullptr);
    frame(d::Command::kDeleteKey, "secret", nullptr);
    // Enough bytes to complete any handshake message the server may be waiting for.
    const std::array<uint8_t, 256> pad{};
    write_all(fd, pad.data(), pad.size());
    uint8_t b;
    read_all(fd, &b, 1);
  } catch (const Closed&) {
    return 0;
  }
  std::cerr << "rpc_probe: store: the store answered\n";
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 9 && argc != 11) {
    std::cerr << "usage: rpc_probe <mode> <host> <port> <target name> <target id> <as name> "
                 "<as id> <key file|-> [<first call id> <last call id>]\n";
    return 2;
  }
  const std::string mode = argv[1];
  const auth::Identity target{argv[4], std::atoi(argv[5])};
  const auth::Identity self{argv[6], std::atoi(argv[7])};
  const bool keyless = std::string(argv[8]) == "-" || mode == "flood";
  const store::JobKey key = keyless ? store::JobKey::none() : store::JobKey::load(argv[8]);
  const uint64_t first = argc == 11 ? std::strtoull(argv[9], nullptr, 10) : 1;
  const uint64_t last = argc == 11 ? std::strtoull(argv[10], nullptr, 10) : 0;
  int fd = -1;
  try {
    if (mode == "flood")
      return flood(argv[2], argv[3], static_cast<int>(first), argv[8],
                   std::chrono::milliseconds(last));
    if (mode == "store") return store_without_key(argv[2], argv[3]);
    fd = connect_to(argv[2], argv[3]);
    if (mode == "member") {
      prove(fd, key, self, target);
      send_forged(fd, first, last);
      send_call(fd, 1, "min", {IValue(int64_t{1}), IValue(int64_t{2})});
      for (int frames = 0; frames < 100; ++frames) {
        Message m = read_message(fd);
        const Response* r = m.get<Response>();
        if (r == nullptr || m.id != 1) continue;
        GW_CHECK(!r->error, IoError, "min(1, 2) failed: ", r->error->message);
        GW_CHECK(r->value.to_int() == 1, IoError, "min(1, 2) answered ", r->value.to_int());
        return 0;
      }
      throw IoError("no answer to min(1, 2) among 100 frames");
    }
    if (mode == "nokey") {
      Message hello;
      hello.body = Handshake{kProtocolVersion, self.name, self.id, {}};
      send_message(fd, hello);
    } else if (mode == "wrongkey") {
      auth::ClientHandshake h(store::JobKey::generate(), auth::Purpose::kRpc, self);
      write_array(fd, h.hello());
      auth::Challenge challenge;
      read_all(fd, challenge.data(), challenge.size());
      write_array(fd, store::JobKey::generate().bytes());  // a "proof" it cannot make
    } else if (mode == "replay") {
      auth::Hello hello;
      auth::Proof proof;
      prove(fd, key, self, target, &hello, &proof);
      ::close(fd);
      fd = connect_to(argv[2], argv[3]);
      write_array(fd, hello);
      auth::Challenge challenge;
      read_all(fd, challenge.data(), challenge.size());
      write_array(fd, proof);
    } else if (mode == "impostor") {
      prove(fd, key, self, target);
    } else {
      std::cerr << "rpc_probe: unknown mode '" << mode << "'\n";
      return 2;
    }
    // A Handshake frame, forged responses and a call with a side effect: none may be acted on.
    Message hello;
    hello.body = Handshake{kProtocolVersion, self.name, self.id, {}};
    send_message(fd, hello);
    send_forged(fd, first, last);
    send_call(fd, 1, "bump", {});
    Message m = read_message(fd);
    std::cerr << "rpc_probe: " << mode << ": the worker answered (message " << m.id << ")\n";
    return 1;
  } catch (const Closed&) {
    if (mode == "member") {
      std::cerr << "rpc_probe: member: the worker closed the connection\n";
      return 1;
    }
    return 0;  // refused
  } catch (const std::exception& e) {
    std::cerr << "rpc_probe: " << mode << ": " << e.what() << "\n";
    return 2;
  }
}
