// TCPStore beyond the shared contract: many clients, hostile frames, dead and stuck servers.
#include <catch2/catch.hpp>
#include <thread>

#include "core/error.h"
#include "store/net_address.h"
#include "store/tcp_socket.h"
#include "store/tcp_store.h"
#include "store/tcp_store_wire.h"
#include "tests/store/store_test_util.h"

using namespace gw::store;
using namespace gw::store::test;
using Catch::Matchers::Contains;

namespace {

Bytes frame(const Bytes& body) {
  Bytes out;
  auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

Bytes le32(uint32_t n) { return {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)}; }

Bytes concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

constexpr uint8_t cmd(detail::Command c) { return static_cast<uint8_t>(c); }

}  // namespace

TEST_CASE("TCPStore master with port 0 binds a free port", "[store][tcp]") {
  TCPStore master("127.0.0.1", 0, 1, true, milliseconds(5000));
  CHECK(master.port() != 0);
  CHECK(master.is_master());
  TCPStore client("127.0.0.1", master.port(), 1, false, milliseconds(5000));
  CHECK_FALSE(client.is_master());
  client.set("k", "v");
  CHECK(master.get_string("k") == "v");

  CHECK_THROWS_WITH(TCPStore("127.0.0.1", master.port(), 1, true, milliseconds(500)),
                    Contains("cannot listen on port " + std::to_string(master.port())));
  CHECK_THROWS_AS(TCPStore("127.0.0.1", 0, 1, false), gw::InvalidArgumentError);
}

TEST_CASE("TCPStore serves many client threads", "[store][tcp]") {
  constexpr int kClients = 6, kAdds = 50;
  TCPStore master("127.0.0.1", 0, kClients + 1, true, milliseconds(30000));
  ThreadGroup threads;
  for (int i = 0; i < kClients; ++i) {
    threads.spawn([&, i] {
      TCPStore client("127.0.0.1", master.port(), kClients + 1, false, milliseconds(30000));
      for (int j = 0; j < kAdds; ++j) client.add("counter", 1);
      client.set("client/" + std::to_string(i), std::to_string(i * i));
      std::vector<std::string> all;
      for (int r = 0; r < kClients; ++r) all.push_back("client/" + std::to_string(r));
      client.wait(all);
      for (int r = 0; r < kClients; ++r) {
        // Each thread checks everyone's value; a mismatch becomes a key the main thread sees.
        if (client.get_string(all[r]) != std::to_string(r * r)) client.add("mismatches", 1);
      }
    });
  }
  CHECK(threads.join().empty());
  CHECK(master.get_string("counter") == std::to_string(kClients * kAdds));
  CHECK_FALSE(master.check({"mismatches"}));
}

TEST_CASE("TCPStore server drops a bad frame and keeps serving", "[store][tcp]") {
  TCPStore master("127.0.0.1", 0, 1, true, milliseconds(10000));
  master.set("k", "v");
  const auto bad = GENERATE(
      Bytes{0xff, 0xff, 0xff, 0xff},                                     // length far over the cap
      le32(detail::kMaxFrameBytes + 1),                                  // just over the cap
      frame(Bytes{}),                                                    // empty body: no command
      frame(Bytes{0x7f}),                                                // unknown command
      frame(concat({{cmd(detail::Command::kSet)}, le32(1000), {'a'}})),  // key longer than frame
      frame(concat({{cmd(detail::Command::kSet)}, le32(1), {'a'}, le32(0), {'x'}})),  // trailing
      frame(concat({{cmd(detail::Command::kCheck)}, le32(0x40000000)})),  // absurd key count
      frame(concat({{cmd(detail::Command::kGet)}, le32(detail::kMaxFieldBytes + 1)})));
  auto deadline = Clock::now() + milliseconds(10000);
  // A client of the job (it proved the key) that then sends a bad frame.
  auto raw =
      detail::connect_store("127.0.0.1", master.port(), JobKey::none(), nullptr, deadline, "test");
  raw.send_all({&bad}, deadline, "test");
  // The server must hang up on us: recv sees the end of the stream, not a reply or a timeout.
  CHECK_THROWS_AS(raw.recv_exact(1, deadline, "test"), gw::IoError);

  CHECK(master.get_string("k") == "v");
  TCPStore client("127.0.0.1", master.port(), 1, false, milliseconds(10000));
  client.set("k2", "v2");
  CHECK(master.get_string("k2") == "v2");
}

TEST_CASE("TCPStore server keeps serving while one client stalls mid-frame", "[store][tcp]") {
  TCPStore master("127.0.0.1", 0, 1, true, milliseconds(10000));
  auto deadline = Clock::now() + milliseconds(10000);
  auto stalled =
      detail::connect_store("127.0.0.1", master.port(), JobKey::none(), nullptr, deadline, "test");
  Bytes partial = concat({le32(100), {cmd(detail::Command::kSet)}, le32(3)});  // 95 bytes owed
  stalled.send_all({&partial}, deadline, "test");
  // And one that stalls inside the handshake.
  auto mute = detail::TcpSocket::connect("127.0.0.1", master.port(), deadline, "test");
  Bytes half_hello(auth::kHelloMagic.begin(), auth::kHelloMagic.end());
  mute.send_all({&half_hello}, deadline, "test");

  TCPStore client("127.0.0.1", master.port(), 1, false, milliseconds(10000));
  client.set("k", "v");
  CHECK(client.get_string("k") == "v");
  CHECK(master.num_keys() == 1);
}

TEST_CASE("TCPStore rejects oversized values before sending", "[store][tcp]") {
  TCPStore master("127.0.0.1", 0, 1, true, milliseconds(10000));
  Bytes huge(detail::kMaxFieldBytes + 1);
  CHECK_THROWS_AS(master.set("big", huge), gw::InvalidArgumentError);
  CHECK_THROWS_WITH(master.set("big", huge), Contains("TCPStore::set"));
  master.set("small", "ok");  // the connection is still usable
  CHECK(master.get_string("small") == "ok");
}

TEST_CASE("TCPStore client waits for a master that starts later", "[store][tcp]") {
  // A port held for the master (no concurrent test can take it meanwhile); the client first.
  const HeldPort held = hold_free_port("127.0.0.1", "test");
  const uint16_t port = held.port();
  std::unique_ptr<TCPStore> master;
  ThreadGroup starter;
  starter.spawn([&] {
    master = std::make_unique<TCPStore>("127.0.0.1", port, 2, true, milliseconds(10000));
    master->set("hello", "from master");
  });
  TCPStore client("127.0.0.1", port, 2, false, milliseconds(10000));
  CHECK(client.get_string("hello") == "from master");
  CHECK(starter.join().empty());
}

TEST_CASE("TCPStore surfaces a dead server as an error, not a hang", "[store][tcp]") {
  // Held past the server's end, so that no concurrent test listens there by the last connect.
  const HeldPort held = hold_free_port("127.0.0.1", "test");
  const uint16_t port = held.port();
  auto master = std::make_unique<TCPStore>("127.0.0.1", port, 2, true, milliseconds(10000));
  TCPStore client("127.0.0.1", port, 2, false, milliseconds(2000));
  client.set("k", "v");

  // A waiter parked on the server when it goes away must be released with an error.
  std::string waiter_error;
  gw::ErrorCode waiter_code = gw::ErrorCode::kInternal;
  std::thread waiter([&] {
    try {
      client.wait({"never"}, milliseconds(60000));
    } catch (const gw::Error& e) {
      waiter_error = e.what();
      waiter_code = e.code();
    }
  });
  auto start = Clock::now();
  master.reset();
  waiter.join();
  CHECK(Clock::now() - start < milliseconds(10000));
  CHECK(waiter_code == gw::ErrorCode::kIo);
  CHECK_THAT(
      waiter_error,
      Contains("[TCPStore::wait] connection to 127.0.0.1:" + std::to_string(port) + " lost"));

  start = Clock::now();
  try {
    client.get("k");
    FAIL("get succeeded without a server");
  } catch (const gw::Error& e) {
    CHECK((e.code() == gw::ErrorCode::kIo || e.code() == gw::ErrorCode::kTimeout));
    CHECK_THAT(e.what(), Contains("TCPStore::get"));
  }
  CHECK(Clock::now() - start < milliseconds(10000));

  CHECK_THROWS_WITH(TCPStore("127.0.0.1", port, 2, false, milliseconds(300)),
                    Contains("could not connect to 127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("TCPStore's server stops promptly while waits are arriving", "[store][tcp]") {
  // A wait whose request was read just as the server stopped must not arm its timer on the
  // closed connection: the destructor would then block for the whole wait. Several clients
  // race their waits against the shutdown, over a few rounds, to land in that window.
  constexpr int kRounds = 20, kClients = 8;
  for (int round = 0; round < kRounds; ++round) {
    auto master =
        std::make_unique<TCPStore>("127.0.0.1", 0, kClients + 1, true, milliseconds(10000));
    std::vector<std::unique_ptr<TCPStore>> clients;
    for (int i = 0; i < kClients; ++i)
      clients.push_back(std::make_unique<TCPStore>("127.0.0.1", master->port(), kClients + 1, false,
                                                   milliseconds(10000)));
    ThreadGroup waiters;
    for (auto& c : clients)
      waiters.spawn([&store = *c] {
        try {
          store.wait({"never"}, milliseconds(60000));
        } catch (const gw::IoError&) {  // the server went away: expected
        }
      });
    const auto start = Clock::now();
    master.reset();
    INFO("round " << round);
    CHECK(Clock::now() - start < milliseconds(10000));
    CHECK(waiters.join().empty());
  }
}

TEST_CASE("TCPStore times out on a server that never answers", "[store][tcp]") {
  SilentListener silent;  // the kernel completes the TCP handshake; nobody ever reads
  auto start = Clock::now();
  // The job-key handshake gets no answer: the client gives up at its timeout.
  CHECK_THROWS_AS(TCPStore("127.0.0.1", silent.port(), 2, false, milliseconds(300)),
                  gw::TimeoutError);
  CHECK(Clock::now() - start >= milliseconds(300));
  CHECK(Clock::now() - start < milliseconds(5000));

  // A server that completes the handshake and then never answers a request.
  MuteServer mute;
  TCPStore client("127.0.0.1", mute.port(), 2, false, milliseconds(10000));
  client.set_timeout(milliseconds(300));
  start = Clock::now();
  CHECK_THROWS_AS(client.set("k", "v"), gw::TimeoutError);
  CHECK(Clock::now() - start < milliseconds(5000));
  start = Clock::now();
  CHECK_THROWS_WITH(client.wait({"k"}, milliseconds(200)), Contains("TCPStore::wait"));
  CHECK(Clock::now() - start >= milliseconds(200));
  CHECK(Clock::now() - start < milliseconds(5000));
}
