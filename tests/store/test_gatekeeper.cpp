// The Gatekeeper's eviction rule, with clients bound to distinct loopback source addresses.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>

#include <future>
#include <optional>
#include <thread>
#include <vector>

#include <asio.hpp>

#include "store/handshake.h"

using namespace gw::store;
using namespace gw::store::auth;
using namespace std::chrono_literals;
using asio::ip::tcp;

namespace {

// A Gatekeeper on 127.0.0.1 with a long handshake timeout: only eviction closes a connection
// early. `admitted` is set when a client proves the key.
struct Door {
  asio::io_context io;
  tcp::acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
  std::optional<Gatekeeper> door;
  std::vector<std::shared_ptr<Stream>> held;
  std::promise<void> admitted;
  std::thread thread;
  explicit Door(int cap) {
    door.emplace(
        acceptor,
        Gatekeeper::Options{
            JobKey::none(), Purpose::kStore, {"store", -1}, 20s, cap, "test door", nullptr},
        [this](std::shared_ptr<Stream> s, const Identity&, const std::string&) {
          held.push_back(std::move(s));
          admitted.set_value();
        });
    door->start();
    thread = std::thread([this] { io.run(); });
  }
  ~Door() {
    asio::post(io, [this] {
      door->stop();
      held.clear();
    });
    thread.join();
  }
  uint16_t port() const { return acceptor.local_endpoint().port(); }
};

// A connection to `port` on 127.0.0.1 from `source` (any 127/8 address), reads timing out
// after `read_limit`.
tcp::socket connect_from(asio::io_context& io, const char* source, uint16_t port,
                         std::chrono::milliseconds read_limit = 5000ms) {
  tcp::socket s(io);
  s.open(tcp::v4());
  s.bind({asio::ip::make_address(source), 0});
  timeval limit{.tv_sec = read_limit.count() / 1000,
                .tv_usec = static_cast<suseconds_t>(read_limit.count() % 1000 * 1000)};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  return s;
}

// Whether the server has closed `s`: a read ends at EOF rather than at the read time limit.
bool closed_by_server(tcp::socket& s) {
  uint8_t b;
  const ssize_t n = ::recv(s.native_handle(), &b, 1, 0);  // not asio's: it would wait on
  return n == 0 || (n < 0 && errno == ECONNRESET);        // without the time limit
}

// Starts a client handshake on `s`; finish() completes it.
struct Client {
  ClientHandshake h{JobKey::none(), Purpose::kStore, {"store-client", -1}};
  void start(tcp::socket& s) { asio::write(s, asio::buffer(h.hello())); }
  // Starts the handshake and waits for the challenge: the server has accepted `s`.
  void accepted(tcp::socket& s) {
    start(s);
    Challenge c;
    asio::read(s, asio::buffer(c));
  }
  void finish(tcp::socket& s) {
    Challenge c;
    asio::read(s, asio::buffer(c));
    asio::write(s, asio::buffer(h.answer(c, {"store", -1})));
  }
};

}  // namespace

TEST_CASE("a flood from one address evicts its own handshakes, not a peer's", "[store][auth]") {
  Door door(8);
  asio::io_context io;
  std::vector<tcp::socket> flood;
  // Connections are accepted in order, so the victims are known: the 9 oldest of the flood (one
  // for the real client, one per later arrival), long before the 20 s handshake timeout. They
  // are given time to see it; the 7 newest, which still wait, a short look.
  auto flood_connection = [&](int i) {
    return connect_from(io, "127.0.0.2", door.port(), i < 9 ? 10000ms : 200ms);
  };
  for (int i = 0; i < 8; ++i) flood.push_back(flood_connection(i));
  tcp::socket real = connect_from(io, "127.0.0.3", door.port());
  Client client;
  client.start(real);
  // 8 more from the flood's address while the real client is mid-handshake, each known to be
  // accepted (its challenge came back) before the next and before the real client goes on.
  for (int i = 8; i < 16; ++i) {
    flood.push_back(flood_connection(i));
    Client().accepted(flood.back());
  }
  client.finish(real);
  REQUIRE(door.admitted.get_future().wait_for(10s) == std::future_status::ready);
  for (int i = 0; i < 16; ++i) {
    INFO("flood connection " << i);
    CHECK(closed_by_server(flood[static_cast<size_t>(i)]) == (i < 9));
  }
}

TEST_CASE("among equally busy addresses the oldest goes: a fresh peer outlives cap-1 more",
          "[store][auth]") {
  Door door(4);
  asio::io_context io;
  std::vector<tcp::socket> flood;
  for (const char* a : {"127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13"})
    flood.push_back(connect_from(io, a, door.port(), 10000ms));  // to be evicted
  // (An address that sorts before the others' as text: no tie is broken by the address.)
  tcp::socket real = connect_from(io, "127.0.0.100", door.port());
  Client client;
  client.start(real);
  for (const char* a : {"127.0.0.20", "127.0.0.21", "127.0.0.22"}) {
    flood.push_back(connect_from(io, a, door.port(), 200ms));  // to stay
    Client().accepted(flood.back());
  }
  client.finish(real);
  REQUIRE(door.admitted.get_future().wait_for(10s) == std::future_status::ready);
  for (size_t i = 0; i < flood.size(); ++i) {
    INFO("flood connection " << i);
    CHECK(closed_by_server(flood[i]) == (i < 4));  // the four oldest went
  }
}
