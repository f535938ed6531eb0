#include "store/tcp_store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <thread>

#include <asio/ip/address.hpp>

#include "core/error.h"
#include "core/log.h"
#include "store/net_address.h"
#include "store/store_util.h"
#include "store/tcp_store_server.h"

namespace gw::store {

using detail::ByteReader;
using detail::ByteWriter;
using detail::Clock;
using detail::Command;
using detail::Status;

namespace {

// How long past its own timeout a get/wait waits for the server's timeout reply before
// declaring the server unresponsive.
constexpr Milliseconds kReplyGrace{1000};

ByteWriter request(const char* op, Command cmd) {
  ByteWriter w(op);
  w.u8(static_cast<uint8_t>(cmd));
  return w;
}

Status read_status(const char* op, ByteReader& reply) {
  auto status = static_cast<Status>(reply.u8());
  switch (status) {
    case Status::kOk:
    case Status::kTimeout:
      return status;
    case Status::kInvalidArgument:
      throw InvalidArgumentError(reply.str());  // the server's message names op and key
  }
  throw IoError(gw::detail::str("[", op, "] unknown reply status ", static_cast<int>(status)));
}

// Where the master's server listens: `configured`, else GW_STORE_BIND_ADDRESS, else the address
// `host` names (TCPStoreOptions::bind_address). `widen`: whether every interface may be used
// for this machine's own hostname mapped to loopback.
std::string bind_address(const std::string& host, const std::string& configured, bool widen) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("GW_STORE_BIND_ADDRESS"); env != nullptr && *env != '\0')
    return env;
  std::error_code ec;
  if (asio::ip::make_address(host, ec), !ec) return host;  // an IP address already
  const std::string text = resolve_host(host, "TCPStore");
  // A name of this machine, which Debian maps to 127.0.1.1: the other nodes can only reach it
  // on its real interfaces.
  if (names_this_host(host, text)) {
    if (widen) return asio::ip::make_address(text).is_v6() ? "::" : "0.0.0.0";
    log_error("[TCPStore] '", host, "' is this machine's name mapped to ", text,
              ", which other hosts cannot reach; listening there anyway, as there is no job key "
              "(set GW_STORE_BIND_ADDRESS and GW_JOB_KEY_FILE for a job across hosts)");
  }
  return text;
}

}  // namespace

TCPStore::TCPStore(std::string host, const TCPStoreOptions& options)
    : Store(options.timeout),
      key_(JobKey::none()),
      host_(std::move(host)),
      port_(options.port),
      world_size_(options.world_size) {
  GW_CHECK(!host_.empty(), InvalidArgumentError, "[TCPStore] host is empty");
  GW_CHECK(options.is_master || port_ != 0, InvalidArgumentError,
           "[TCPStore] port 0 is only meaningful for the master (it picks a free port)");
  tls_ = make_tls_context(options.tls, "TCPStore");
  if (options.is_master) {
    const bool keyed = !client_job_key(options.job_key).is_none();
    const std::string address =
        bind_address(host_, options.bind_address, keyed || options.allow_unauthenticated);
    key_ = resolve_job_key(options.job_key, address, options.allow_unauthenticated, "TCPStore");
    server_ = std::make_unique<detail::TCPStoreServer>(address, options, key_, tls_);
    port_ = server_->port();
  } else {
    key_ = client_job_key(options.job_key);
  }
  // Connect now so a missing master is reported by the constructor, as in PyTorch.
  auto socket = detail::connect_store(host_, port_, key_, tls_, deadline(), "TCPStore");
  std::lock_guard lock(idle_mu_);
  idle_.push_back(std::move(socket));
}

TCPStore::TCPStore(std::string host, uint16_t port, int world_size, bool is_master,
                   Milliseconds timeout)
    : TCPStore(std::move(host), [&] {
        TCPStoreOptions o;
        o.port = port, o.world_size = world_size, o.is_master = is_master, o.timeout = timeout;
        return o;
      }()) {}

TCPStore::~TCPStore() = default;

detail::TcpSocket detail::connect_store(const std::string& host, uint16_t port, const JobKey& key,
                                        const TlsContext& tls, Clock::time_point deadline,
                                        const char* op, bool server_was_up) {
  // A server flooded with connections that never prove the key closes the oldest waiting ones
  // (a real client's too, rarely): a handshake cut short is tried again, a few times. One that
  // TLS refused (a certificate outside the job's CA) is not.
  constexpr int kAttempts = 4;
  auto backoff = std::chrono::milliseconds(10);
  for (int attempt = 1;; ++attempt) {
    auto socket = TcpSocket::connect(host, port, deadline, op, server_was_up);
    auto cut_short = [&](const IoError& e) {
      if (attempt == kAttempts || Clock::now() + backoff >= deadline)
        throw IoError(gw::detail::str("[", op, "] the store at ", host, ":", port,
                                      " closed the connection during the ", tls ? "TLS or " : "",
                                      "job-key handshake (", attempt,
                                      " attempts; is it a gradwire TCPStore?): ", e.what()));
      std::this_thread::sleep_for(backoff);
      backoff *= 4;
    };
    std::optional<auth::ClientHandshake> handshake;
    auth::Challenge challenge;
    try {
      if (tls) socket.start_tls(tls, deadline, op);
      handshake.emplace(key, auth::Purpose::kStore, auth::Identity{"store-client", -1},
                        socket.channel_binding());
      const Bytes hello(handshake->hello().begin(), handshake->hello().end());
      socket.send_all({&hello}, deadline, op);
      const Bytes got = socket.recv_exact(challenge.size(), deadline, op);
      std::copy(got.begin(), got.end(), challenge.begin());
    } catch (const TlsRefusedError&) {
      throw;
    } catch (const IoError& e) {
      cut_short(e);
      continue;
    }
    const auth::Proof proof = handshake->answer(challenge, {"store", -1});  // throws: wrong key
    const Bytes proof_bytes(proof.begin(), proof.end());
    try {
      socket.send_all({&proof_bytes}, deadline, op);
    } catch (const IoError& e) {
      cut_short(e);
      continue;
    }
    return socket;
  }
}

ByteReader TCPStore::call(const char* op, const ByteWriter& request, Clock::time_point deadline) {
  std::optional<detail::TcpSocket> socket;
  {
    std::lock_guard lock(idle_mu_);
    if (!idle_.empty()) {
      socket.emplace(std::move(idle_.back()));
      idle_.pop_back();
    }
  }
  // The constructor connected: the server was up.
  if (!socket) socket.emplace(detail::connect_store(host_, port_, key_, tls_, deadline, op, true));

  const Bytes& body = request.buffer();
  Bytes header(detail::kFrameHeaderBytes);
  auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) header[i] = static_cast<uint8_t>(n >> (8 * i));
  socket->send_all({&header, &body}, deadline, op);

  ByteReader reply_header(socket->recv_exact(detail::kFrameHeaderBytes, deadline, op), op);
  uint32_t reply_size = reply_header.u32();
  GW_CHECK(reply_size > 0 && reply_size <= detail::kMaxFrameBytes, IoError, "[", op,
           "] store server sent a reply of ", reply_size, " bytes");
  ByteReader reply(socket->recv_exact(reply_size, deadline, op), op);

  std::lock_guard lock(idle_mu_);
  idle_.push_back(std::move(*socket));
  return reply;
}

ByteReader TCPStore::call_ok(const char* op, const ByteWriter& request) {
  return call_ok(op, request, deadline());
}

ByteReader TCPStore::call_ok(const char* op, const ByteWriter& request,
                             detail::Clock::time_point deadline) {
  ByteReader reply = call(op, request, deadline);
  GW_CHECK(read_status(op, reply) == Status::kOk, IoError, "[", op,
           "] unexpected timeout reply from the store server");
  return reply;
}

Bytes TCPStore::wait_on_server(const char* op, Command cmd, const std::vector<std::string>& keys,
                               Milliseconds timeout) {
  ByteWriter w = request(op, cmd);
  if (cmd == Command::kGet)
    w.str(keys.at(0));
  else
    w.strings(keys);
  w.u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  ByteReader reply = call(op, w, Clock::now() + timeout + kReplyGrace);
  if (read_status(op, reply) == Status::kTimeout) {
    std::vector<std::string> missing = reply.strings();
    throw TimeoutError(wait_timeout_message(op, keys, timeout, [&](const std::string& k) {
      return std::find(missing.begin(), missing.end(), k) == missing.end();
    }));
  }
  Bytes value = cmd == Command::kGet ? reply.bytes() : Bytes();
  reply.expect_done();
  return value;
}

void TCPStore::set(const std::string& key, const Bytes& value) {
  const char* op = "TCPStore::set";
  ByteWriter w = request(op, Command::kSet);
  w.str(key);
  w.bytes(value);
  ByteReader reply = call_ok(op, w);
  reply.expect_done();
}

Bytes TCPStore::get(const std::string& key) {
  return wait_on_server("TCPStore::get", Command::kGet, {key}, timeout());
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  return add_within(key, delta, timeout());
}

int64_t TCPStore::add_within(const std::string& key, int64_t delta, Milliseconds timeout) {
  const char* op = "TCPStore::add";
  ByteWriter w = request(op, Command::kAdd);
  w.str(key);
  w.u64(static_cast<uint64_t>(delta));
  ByteReader reply = call_ok(op, w, detail::Clock::now() + timeout);
  auto value = static_cast<int64_t>(reply.u64());
  reply.expect_done();
  return value;
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const char* op = "TCPStore::compare_set";
  ByteWriter w = request(op, Command::kCompareSet);
  w.str(key);
  w.bytes(expected);
  w.bytes(desired);
  ByteReader reply = call_ok(op, w);
  Bytes value = reply.bytes();
  reply.expect_done();
  return value;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  const char* op = "TCPStore::check";
  ByteWriter w = request(op, Command::kCheck);
  w.strings(keys);
  ByteReader reply = call_ok(op, w);
  bool all = reply.u8() != 0;
  reply.expect_done();
  return all;
}

bool TCPStore::delete_key(const std::string& key) {
  const char* op = "TCPStore::delete_key";
  ByteWriter w = request(op, Command::kDeleteKey);
  w.str(key);
  ByteReader reply = call_ok(op, w);
  bool existed = reply.u8() != 0;
  reply.expect_done();
  return existed;
}

int64_t TCPStore::num_keys() {
  const char* op = "TCPStore::num_keys";
  ByteWriter w = request(op, Command::kNumKeys);
  ByteReader reply = call_ok(op, w);
  auto n = static_cast<int64_t>(reply.u64());
  reply.expect_done();
  return n;
}

void TCPStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  wait_on_server("TCPStore::wait", Command::kWait, keys, timeout);
}

}  // namespace gw::store
