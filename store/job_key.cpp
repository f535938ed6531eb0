#include "store/job_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>

#include <asio/ip/address.hpp>

#include "core/error.h"

namespace gw::store {
namespace {

// OpenSSL frees its state in an exit handler of its own. A thread still reconnecting to a store
// while the process exits (a liveness watcher of a process group never destroyed) would then
// use freed state and crash the exit: OpenSSL's state is left to the end of the process instead.
// First, before any other OpenSSL call of the program's.
[[maybe_unused]] const bool kOpenSslKeptToExit =
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;

template <size_t N>
std::array<uint8_t, N> random_bytes(const char* what) {
  std::array<uint8_t, N> out{};
  GW_CHECK(RAND_bytes(out.data(), static_cast<int>(N)) == 1, IoError, "[", what,
           "] the random generator failed");
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string octal(unsigned mode) {
  std::ostringstream os;
  os << '0' << std::oct << mode;
  return os.str();
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0);
}

}  // namespace

// --- the key ----------------------------------------------------------------------------------

JobKey JobKey::generate() {
  JobKey k;
  k.bytes_ = random_bytes<kBytes>("job key");
  return k;
}

JobKey JobKey::load(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GW_CHECK(fd >= 0, InvalidArgumentError, "[job key] cannot open key file '", path,
           "': ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  std::string text(200, '\0');
  const ssize_t n = stat_ok && S_ISREG(st.st_mode) ? ::read(fd, text.data(), text.size()) : -1;
  ::close(fd);
  GW_CHECK(n >= 0, InvalidArgumentError, "[job key] cannot read key file '", path,
           "' (it must be a regular file)");
  GW_CHECK((st.st_mode & 077) == 0, InvalidArgumentError, "[job key] key file '", path,
           "' has mode ", octal(st.st_mode & 0777),
           ": others may read it. Make it private: chmod 600 (under Kubernetes, copy the mounted "
           "secret first: install -m 600 <secret> <private path>)");
  text.resize(static_cast<size_t>(n));
  const auto first = text.find_first_not_of(" \t\r\n");
  const auto last = text.find_last_not_of(" \t\r\n");
  const std::string hex = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  JobKey k;
  bool ok = hex.size() == 2 * kBytes;
  for (size_t i = 0; ok && i < kBytes; ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    ok = hi >= 0 && lo >= 0;
    k.bytes_[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  GW_CHECK(ok, InvalidArgumentError, "[job key] key file '", path, "' must hold ", 2 * kBytes,
           " hex digits (e.g. made by: openssl rand -hex 32), found ", hex.size(), " characters");
  return k;
}

std::optional<JobKey> JobKey::from_env() {
  const char* path = std::getenv(kJobKeyEnv);
  if (path == nullptr || *path == '\0') return std::nullopt;
  return load(path);
}

void JobKey::write_new(const std::string& path) const {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  GW_CHECK(fd >= 0, IoError, "[job key] cannot create key file '", path,
           "': ", std::strerror(errno));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  for (uint8_t b : bytes_) text += {kHex[b >> 4], kHex[b & 15]};
  text += '\n';
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  GW_CHECK(ok, IoError, "[job key] cannot write key file '", path, "'");
}

bool JobKey::is_none() const { return *this == JobKey(); }

JobKey client_job_key(const std::optional<JobKey>& given) {
  if (given) return *given;
  if (auto k = JobKey::from_env()) return *k;
  return JobKey::none();
}

JobKey resolve_job_key(const std::optional<JobKey>& given, const std::string& address,
                       bool allow_unauthenticated, const char* op) {
  JobKey key = client_job_key(given);
  if (!key.is_none()) return key;
  std::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  const bool loopback = !ec && ip.is_loopback();
  GW_CHECK(loopback || allow_unauthenticated || env_flag(kAllowUnauthenticatedEnv),
           InvalidArgumentError, "[", op, "] refusing to listen on ", address,
           " without a job key: anyone who can reach it could join, call or rendezvous. Set ",
           kJobKeyEnv,
           " to a private file of 64 hex digits shared by the job's processes (gwrun makes one; "
           "by hand: umask 077; openssl rand -hex 32 > job.key), or, on a trusted network only, "
           "set ",
           kAllowUnauthenticatedEnv, "=1 (or the options' allow_unauthenticated)");
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::cerr << "gradwire: no job key (" << kJobKeyEnv << "): connections on " << address
              << " are not authenticated\n";
  });
  return key;
}

// --- the handshake ----------------------------------------------------------------------------

namespace auth {
namespace {

// Writes and reads the fields of the fixed-size messages.
struct Out {
  uint8_t* p;
  template <size_t N>
  void raw(const std::array<uint8_t, N>& a) {
    std::memcpy(p, a.data(), N);
    p += N;
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(v >> (8 * i));
  }
  void identity(const Identity& who) {
    u32(static_cast<uint32_t>(who.id));
    std::memset(p, 0, kNameField);
    std::memcpy(p, who.name.data(), who.name.size());
    p += kNameField;
  }
};

struct In {
  const uint8_t* p;
  template <size_t N>
  std::array<uint8_t, N> raw() {
    std::array<uint8_t, N> a;
    std::memcpy(a.data(), p, N);
    p += N;
    return a;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{*p++} << (8 * i);
    return v;
  }
  Identity identity() {
    Identity who;
    who.id = static_cast<int32_t>(u32());
    const auto* name = reinterpret_cast<const char*>(p);
    who.name.assign(name, strnlen(name, kNameField));
    p += kNameField;
    return who;
  }
};

void check_identity(const Identity& who) {
  GW_CHECK(who.name.size() <= Identity::kMaxName, InvalidArgumentError, "[handshake] name of ",
           who.name.size(), " bytes exceeds ", Identity::kMaxName);
}

// The proof of one direction: HMAC-SHA256(key, label | purpose | binding | nonces | identities).
std::array<uint8_t, kMacBytes> proof(const JobKey& key, const char* label, Purpose purpose,
                                     const ChannelBinding& binding,
                                     const std::array<uint8_t, kNonceBytes>& client_nonce,
                                     const std::array<uint8_t, kNonceBytes>& server_nonce,
                                     const Identity& client, const Identity& server) {
  std::array<uint8_t, 32 + 1 + sizeof(ChannelBinding) + 2 * kNonceBytes + 2 * (4 + kNameField)>
      data{};
  std::strncpy(reinterpret_cast<char*>(data.data()), label, 32);
  Out out{data.data() + 32};
  *out.p++ = static_cast<uint8_t>(purpose);
  out.raw(binding);
  out.raw(client_nonce);
  out.raw(server_nonce);
  out.identity(client);
  out.identity(server);
  std::array<uint8_t, kMacBytes> mac{};
  unsigned len = 0;
  GW_CHECK(HMAC(EVP_sha256(), key.bytes().data(), static_cast<int>(key.bytes().size()), data.data(),
                data.size(), mac.data(), &len) != nullptr &&
               len == kMacBytes,
           IoError, "[handshake] HMAC-SHA256 failed");
  return mac;
}

constexpr const char* kClientLabel = "gradwire client proof";
constexpr const char* kServerLabel = "gradwire server proof";

}  // namespace

ClientHandshake::ClientHandshake(const JobKey& key, Purpose purpose, Identity self,
                                 const ChannelBinding& binding)
    : key_(key),
      purpose_(purpose),
      self_(std::move(self)),
      binding_(binding),
      nonce_(random_bytes<kNonceBytes>("handshake")) {
  check_identity(self_);
  Out out{hello_.data()};
  out.raw(kHelloMagic);
  out.u32(static_cast<uint32_t>(purpose_));
  out.raw(nonce_);
  out.identity(self_);
}

Proof ClientHandshake::answer(const Challenge& challenge, const Identity& expected) const {
  In in{challenge.data()};
  GW_CHECK(in.raw<4>() == kChallengeMagic, IoError, "[handshake] the server expected as '",
           expected.name, "' does not speak gradwire's handshake");
  const auto server_nonce = in.raw<kNonceBytes>();
  const Identity server = in.identity();
  const auto server_proof = in.raw<kMacBytes>();
  GW_CHECK(server == expected, IoError, "[handshake] expected '", expected.name, "' (id ",
           expected.id, "), the server says it is '", server.name, "' (id ", server.id, ")");
  const auto want =
      proof(key_, kServerLabel, purpose_, binding_, nonce_, server_nonce, self_, server);
  GW_CHECK(CRYPTO_memcmp(want.data(), server_proof.data(), kMacBytes) == 0, IoError,
           "[handshake] '", expected.name, "' failed to prove the job key (a different key?)");
  return proof(key_, kClientLabel, purpose_, binding_, nonce_, server_nonce, self_, server);
}

ServerHandshake::ServerHandshake(const JobKey& key, Purpose purpose, Identity self,
                                 const ChannelBinding& binding)
    : key_(key),
      purpose_(purpose),
      self_(std::move(self)),
      binding_(binding),
      nonce_(random_bytes<kNonceBytes>("handshake")) {
  check_identity(self_);
}

Identity ServerHandshake::read_hello(const Hello& hello) {
  In in{hello.data()};
  GW_CHECK(in.raw<4>() == kHelloMagic, IoError,
           "[handshake] the client does not speak gradwire's handshake");
  const uint32_t purpose = in.u32();
  GW_CHECK(purpose == static_cast<uint32_t>(purpose_), IoError, "[handshake] the client came for ",
           purpose == 1   ? "RPC"
           : purpose == 2 ? "a store"
                          : "something else",
           ", this server is ", purpose_ == Purpose::kRpc ? "RPC" : "a store");
  client_nonce_ = in.raw<kNonceBytes>();
  client_ = in.identity();
  Out out{challenge_.data()};
  out.raw(kChallengeMagic);
  out.raw(nonce_);
  out.identity(self_);
  out.raw(proof(key_, kServerLabel, purpose_, binding_, client_nonce_, nonce_, client_, self_));
  return client_;
}

void ServerHandshake::check_proof(const Proof& got) const {
  const auto want =
      proof(key_, kClientLabel, purpose_, binding_, client_nonce_, nonce_, client_, self_);
  GW_CHECK(CRYPTO_memcmp(want.data(), got.data(), kMacBytes) == 0, IoError, "[handshake] '",
           client_.name, "' (id ", client_.id, ") failed to prove the job key");
}

}  // namespace auth
}  // namespace gw::store
