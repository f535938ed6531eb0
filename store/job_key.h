// gw::store::JobKey and the handshake that proves it: how both ends of every gradwire connection
// (TCPStore and RPC) know the other belongs to the same job before either reads anything else.
//
// Mental model: a job shares one secret, 32 random bytes. gwrun generates it per job and hands
// it to its workers as a file named by the environment variable GW_JOB_KEY_FILE (64 hex
// digits, readable only by its owner; never on a command line); under another launcher the
// job names its own file the same way. A connection opens with three fixed-size messages:
//
//   client -> server  Hello      magic, purpose, client nonce, client name and id
//   server -> client  Challenge  server nonce, server name and id, server proof
//   client -> server  Proof      client proof
//
// Each proof is an HMAC-SHA256 under the key over both fresh nonces, the connection's purpose,
// both identities and the channel binding (under TLS, store/tls.h), with a different label
// per direction. A peer without the key cannot make
// either proof; a recorded handshake fails against the other side's fresh nonce; a proof made
// for one connection, purpose or name is worth nothing on another. Messages have fixed sizes:
// nothing a peer claims sizes an allocation before it has proved the key.
//
// Without a key (JobKey::none()) the same handshake runs with an all-zero key: it names the
// peer but proves nothing. Servers refuse to listen beyond loopback that way
// (resolve_job_key).
//
//   JobKey key = JobKey::generate();
//   ClientHandshake client(key, Purpose::kRpc, {"worker0", 0});
//   ServerHandshake server(key, Purpose::kRpc, {"worker1", 1});
//   Identity who = server.read_hello(client.hello());          // {"worker0", 0}, not yet proven
//   auto proof = client.answer(server.challenge(), {"worker1", 1});  // throws on a bad server
//   server.check_proof(proof);                                  // throws on a bad client
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace gw::store {

inline constexpr const char* kJobKeyEnv = "GW_JOB_KEY_FILE";
inline constexpr const char* kAllowUnauthenticatedEnv = "GW_ALLOW_UNAUTHENTICATED";

class JobKey {
 public:
  static constexpr size_t kBytes = 32;

  // 32 bytes from the operating system's random generator.
  static JobKey generate();
  // The key in `path`: 64 hex digits (surrounding whitespace ignored). Throws
  // InvalidArgumentError naming the file if it is missing, malformed, or readable or writable
  // by anyone but its owner.
  static JobKey load(const std::string& path);
  // The key GW_JOB_KEY_FILE names, or nullopt when the variable is unset or empty.
  static std::optional<JobKey> from_env();
  // The all-zero key of a job without one: the handshake still names the peer.
  static JobKey none() { return JobKey(); }

  // Writes the key to a new file `path` with mode 0600; throws IoError if it exists.
  void write_new(const std::string& path) const;
  bool is_none() const;
  const std::array<uint8_t, kBytes>& bytes() const { return bytes_; }
  bool operator==(const JobKey&) const = default;

 private:
  JobKey() = default;
  std::array<uint8_t, kBytes> bytes_{};
};

// The key a server listening on `address` uses: `given`, else GW_JOB_KEY_FILE's, else none —
// which is refused (InvalidArgumentError saying how to provide a key or opt out) unless the
// address is loopback or `allow_unauthenticated` (or GW_ALLOW_UNAUTHENTICATED=1) says the
// network is trusted. Without a key, a warning is printed once per process. `op` names the caller.
JobKey resolve_job_key(const std::optional<JobKey>& given, const std::string& address,
                       bool allow_unauthenticated, const char* op);
// The key a client uses: `given`, else GW_JOB_KEY_FILE's, else none.
JobKey client_job_key(const std::optional<JobKey>& given);

namespace auth {

// What a connection is for: a handshake for one is refused by the other.
enum class Purpose : uint8_t { kRpc = 1, kStore = 2 };

// Who an end of a connection says it is.
struct Identity {
  static constexpr size_t kMaxName = 127;
  std::string name;  // at most kMaxName bytes
  int32_t id = -1;
  bool operator==(const Identity&) const = default;
};

// What opens a Hello and a Challenge: version 2 (the channel binding changed the proofs; version
// 1 opened with GWA1 and GWA2), so a peer still on version 1 is told it does not speak this
// handshake rather than that it lacks the key.
inline constexpr std::array<uint8_t, 4> kHelloMagic{'G', 'W', 'A', '3'};
inline constexpr std::array<uint8_t, 4> kChallengeMagic{'G', 'W', 'A', '4'};

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kNameField = 128;
inline constexpr size_t kHelloBytes = 4 + 4 + kNonceBytes + 4 + kNameField;
inline constexpr size_t kChallengeBytes = 4 + kNonceBytes + 4 + kNameField + kMacBytes;
inline constexpr size_t kProofBytes = kMacBytes;

// What ties a handshake to the channel beneath it (a TLS session's exported keying material,
// store/tls.h; all zeros on plain TCP): both proofs cover it, so proofs relayed from one
// TLS session into another fail.
using ChannelBinding = std::array<uint8_t, 32>;

using Hello = std::array<uint8_t, kHelloBytes>;
using Challenge = std::array<uint8_t, kChallengeBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

// The client's side: hello(), then answer() the server's challenge.
class ClientHandshake {
 public:
  ClientHandshake(const JobKey& key, Purpose purpose, Identity self,
                  const ChannelBinding& binding = {});
  const Hello& hello() const { return hello_; }
  // Checks that the server is `expected` and holds the key; returns the proof to send. Throws
  // IoError naming the server otherwise.
  Proof answer(const Challenge& challenge, const Identity& expected) const;

 private:
  JobKey key_;
  Purpose purpose_;
  Identity self_;
  ChannelBinding binding_;
  std::array<uint8_t, kNonceBytes> nonce_;
  Hello hello_;
};

// The server's side: read_hello(), send challenge(), then check_proof().
class ServerHandshake {
 public:
  ServerHandshake(const JobKey& key, Purpose purpose, Identity self,
                  const ChannelBinding& binding = {});
  // Parses the client's hello (IoError if it is not one for this purpose); returns who it claims
  // to be — proven only once check_proof() returns.
  Identity read_hello(const Hello& hello);
  const Challenge& challenge() const { return challenge_; }
  // Throws IoError unless the client holds the key.
  void check_proof(const Proof& proof) const;

 private:
  JobKey key_;
  Purpose purpose_;
  Identity self_;
  ChannelBinding binding_;
  Identity client_;
  std::array<uint8_t, kNonceBytes> client_nonce_{};
  std::array<uint8_t, kNonceBytes> nonce_;
  Challenge challenge_{};
};

}  // namespace auth
}  // namespace gw::store
