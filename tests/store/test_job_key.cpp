// The job key's file format and the handshake's messages, without sockets (the socket-level
// tests are in tests/rpc/test_security.cpp).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "store/job_key.h"

using namespace gw::store;
using namespace gw::store::auth;
using Catch::Contains;

namespace {

struct KeyDir {
  std::filesystem::path path;
  KeyDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gw-key-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~KeyDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const auto p = path / name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p.string();
  }
};

// One complete handshake: the server's view of the client, or the exception either side threw.
Identity handshake(const JobKey& client_key, const JobKey& server_key,
                   Purpose client_purpose = Purpose::kRpc) {
  ClientHandshake client(client_key, client_purpose, {"worker0", 0});
  ServerHandshake server(server_key, Purpose::kRpc, {"worker1", 1});
  const Identity claimed = server.read_hello(client.hello());
  server.check_proof(client.answer(server.challenge(), {"worker1", 1}));
  return claimed;
}

}  // namespace

TEST_CASE("a job key file round-trips and must be private and well-formed", "[store][auth]") {
  KeyDir dir;
  const JobKey key = JobKey::generate();
  CHECK_FALSE(key.is_none());
  CHECK(key != JobKey::generate());
  const std::string path = (dir.path / "job.key").string();
  key.write_new(path);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(JobKey::load(path) == key);
  CHECK_THROWS_WITH(key.write_new(path), Contains("cannot create key file"));  // never overwrites

  const std::string hex(64, 'a');
  CHECK(JobKey::load(dir.write("spaced", "  " + hex + "\n\n", 0600)).bytes()[0] == 0xaa);
  CHECK_THROWS_WITH(JobKey::load(dir.write("open", hex, 0644)),
                    Contains("has mode 0644") && Contains("chmod 600"));
  CHECK_THROWS_WITH(JobKey::load(dir.write("short", hex.substr(1), 0600)),
                    Contains("must hold 64 hex digits") && Contains("found 63"));
  CHECK_THROWS_WITH(JobKey::load(dir.write("nothex", std::string(64, 'g'), 0600)),
                    Contains("must hold 64 hex digits"));
  CHECK_THROWS_WITH(JobKey::load((dir.path / "missing").string()), Contains("cannot open"));
}

TEST_CASE("the handshake admits the key's holders and no one else", "[store][auth]") {
  const JobKey key = JobKey::generate();
  CHECK(handshake(key, key) == Identity{"worker0", 0});
  CHECK(handshake(JobKey::none(), JobKey::none()) == Identity{"worker0", 0});
  // A client with another key finds the server's proof wrong; a server with another key, the
  // client's.
  CHECK_THROWS_WITH(handshake(JobKey::generate(), key),
                    Contains("'worker1' failed to prove the job key"));
  ClientHandshake client(key, Purpose::kRpc, {"worker0", 0});
  ServerHandshake server(JobKey::generate(), Purpose::kRpc, {"worker1", 1});
  server.read_hello(client.hello());
  CHECK_THROWS(client.answer(server.challenge(), {"worker1", 1}));
  // A store's handshake is refused by an RPC server.
  CHECK_THROWS_WITH(handshake(key, key, Purpose::kStore), Contains("came for a store"));
}

TEST_CASE("a recorded handshake is worthless on a new connection", "[store][auth]") {
  const JobKey key = JobKey::generate();
  ClientHandshake client(key, Purpose::kRpc, {"worker0", 0});
  ServerHandshake first(key, Purpose::kRpc, {"worker1", 1});
  first.read_hello(client.hello());
  const Proof recorded = client.answer(first.challenge(), {"worker1", 1});
  first.check_proof(recorded);
  // Replayed to a new server session (a fresh nonce): refused.
  ServerHandshake second(key, Purpose::kRpc, {"worker1", 1});
  second.read_hello(client.hello());
  CHECK_THROWS_WITH(second.check_proof(recorded), Contains("failed to prove the job key"));
  // The server's proof is bound to the identity the client expects.
  ClientHandshake again(key, Purpose::kRpc, {"worker0", 0});
  ServerHandshake third(key, Purpose::kRpc, {"worker1", 1});
  third.read_hello(again.hello());
  CHECK_THROWS_WITH(again.answer(third.challenge(), {"worker2", 2}),
                    Contains("expected 'worker2'") && Contains("says it is 'worker1'"));
}

TEST_CASE("the proofs cover both identities: rewriting one in flight breaks them",
          "[store][auth]") {
  const JobKey key = JobKey::generate();
  constexpr size_t kHelloName = 4 + 4 + kNonceBytes + 4;  // offsets of the name fields
  constexpr size_t kChallengeName = 4 + kNonceBytes + 4;
  // The client's name, rewritten on its way to the server: the client's proof fails there.
  {
    ClientHandshake client(key, Purpose::kRpc, {"worker0", 0});
    Hello hello = client.hello();
    hello[kHelloName + 6] = '9';  // "worker9"
    ServerHandshake server(key, Purpose::kRpc, {"worker1", 1});
    CHECK(server.read_hello(hello) == Identity{"worker9", 0});
    // The client never sees the rewrite, but the server's proof is over "worker9": refused.
    CHECK_THROWS_WITH(client.answer(server.challenge(), {"worker1", 1}),
                      Contains("failed to prove the job key"));
  }
  // The server's name, rewritten to the one the client expects: its proof fails at the client.
  {
    ClientHandshake client(key, Purpose::kRpc, {"worker0", 0});
    ServerHandshake server(key, Purpose::kRpc, {"worker1", 1});
    server.read_hello(client.hello());
    Challenge challenge = server.challenge();
    challenge[kChallengeName + 6] = '2';  // "worker2"
    CHECK_THROWS_WITH(client.answer(challenge, {"worker2", 1}),
                      Contains("'worker2' failed to prove the job key"));
  }
}

TEST_CASE("the proofs cover the channel binding: relayed between TLS sessions, they fail",
          "[store][auth]") {
  const JobKey key = JobKey::generate();
  ChannelBinding ours{}, theirs{};
  ours.fill(1);
  theirs.fill(2);
  // The same binding on both ends (one TLS session): proven.
  {
    ClientHandshake client(key, Purpose::kRpc, {"worker0", 0}, ours);
    ServerHandshake server(key, Purpose::kRpc, {"worker1", 1}, ours);
    server.read_hello(client.hello());
    server.check_proof(client.answer(server.challenge(), {"worker1", 1}));
  }
  // A relay holding two sessions: each end computes over its own; the client refuses first.
  ClientHandshake client(key, Purpose::kRpc, {"worker0", 0}, ours);
  ServerHandshake server(key, Purpose::kRpc, {"worker1", 1}, theirs);
  server.read_hello(client.hello());
  CHECK_THROWS_WITH(client.answer(server.challenge(), {"worker1", 1}),
                    Contains("failed to prove the job key"));
}

TEST_CASE("a server without a key refuses to listen beyond loopback", "[store][auth]") {
  CHECK(resolve_job_key(std::nullopt, "127.0.0.1", false, "test").is_none());
  CHECK(resolve_job_key(std::nullopt, "::1", false, "test").is_none());
  CHECK_THROWS_WITH(resolve_job_key(std::nullopt, "10.1.2.3", false, "test"),
                    Contains("[test] refusing to listen on 10.1.2.3 without a job key"));
  CHECK(resolve_job_key(std::nullopt, "10.1.2.3", true, "test").is_none());
  const JobKey key = JobKey::generate();
  CHECK(resolve_job_key(key, "10.1.2.3", false, "test") == key);
}
