#include "store/rendezvous.h"

#include <charconv>
#include <cstdlib>

#include "core/error.h"
#include "store/file_store.h"
#include "store/net_address.h"
#include "store/tcp_store.h"

namespace gw::store {
namespace {

constexpr const char* kOp = "rendezvous";

uint16_t parse_port(const std::string& text, const std::string& source) {
  int port = -1;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  GW_CHECK(ec == std::errc() && ptr == text.data() + text.size() && port >= 0 && port <= 65535,
           InvalidArgumentError, "[", kOp, "] ", source, " has port '", text,
           "', expected an integer in [0, 65535]");
  return static_cast<uint16_t>(port);
}

std::shared_ptr<Store> tcp_store(const std::string& host, uint16_t port, int rank, int world_size,
                                 Milliseconds timeout, const std::string& source,
                                 TCPStoreOptions options) {
  GW_CHECK(!host.empty(), InvalidArgumentError, "[", kOp, "] ", source, " has an empty host");
  GW_CHECK(port != 0 || rank == 0, InvalidArgumentError, "[", kOp, "] ", source,
           " has port 0, which only the master (rank 0) can use; rank ", rank, " must connect");
  options.port = port, options.world_size = world_size, options.is_master = rank == 0;
  options.timeout = timeout;
  return std::make_shared<TCPStore>(host, options);
}

std::string env_var(const char* name) {
  const char* v = std::getenv(name);
  GW_CHECK(v != nullptr && *v != '\0', InvalidArgumentError, "[", kOp,
           "] init_method env:// needs the environment variable ", name, ", which is not set");
  return v;
}

// An init_method URL, parsed: a TCP master (host, port) or a file.
struct Target {
  std::string host, source;  // TCP: the master's host, and where it was named
  uint16_t port = 0;
  std::string file;  // file://
};

Target parse_init_method(const std::string& init_method) {
  const auto scheme_end = init_method.find("://");
  GW_CHECK(scheme_end != std::string::npos, InvalidArgumentError, "[", kOp, "] init_method '",
           init_method, "' is not a URL; expected env://, tcp://host:port or file:///path");
  const std::string scheme = init_method.substr(0, scheme_end);
  const std::string rest = init_method.substr(scheme_end + 3);
  Target t;
  if (scheme == "env") {
    GW_CHECK(rest.empty(), InvalidArgumentError, "[", kOp, "] init_method '", init_method,
             "': env:// takes no address, it reads MASTER_ADDR and MASTER_PORT");
    t.source = "MASTER_ADDR/MASTER_PORT";
    t.host = env_var("MASTER_ADDR");
    t.port = parse_port(env_var("MASTER_PORT"), "MASTER_PORT");
  } else if (scheme == "tcp") {
    // "host:port" or "[v6 literal]:port"; the port is after the last colon.
    const auto colon = rest.rfind(':');
    GW_CHECK(colon != std::string::npos, InvalidArgumentError, "[", kOp, "] init_method '",
             init_method, "' has no port; expected tcp://host:port");
    t.host = rest.substr(0, colon);
    if (t.host.size() >= 2 && t.host.front() == '[' && t.host.back() == ']')
      t.host = t.host.substr(1, t.host.size() - 2);
    t.source = "init_method '" + init_method + "'";
    t.port = parse_port(rest.substr(colon + 1), t.source);
  } else if (scheme == "file") {
    GW_CHECK(!rest.empty() && rest.front() == '/', InvalidArgumentError, "[", kOp,
             "] init_method '", init_method, "' needs an absolute path: file:///path/to/file");
    t.file = rest;
  } else {
    throw InvalidArgumentError(gw::detail::str("[", kOp, "] init_method '", init_method,
                                               "' has unknown scheme '", scheme,
                                               "'; expected env://, tcp:// or file://"));
  }
  return t;
}

}  // namespace

std::shared_ptr<Store> rendezvous(const std::string& init_method, int rank, int world_size,
                                  Milliseconds timeout, const TCPStoreOptions& tcp) {
  GW_CHECK(world_size >= 1, InvalidArgumentError, "[", kOp, "] world_size ", world_size,
           " must be at least 1");
  GW_CHECK(rank >= 0 && rank < world_size, InvalidArgumentError, "[", kOp, "] rank ", rank,
           " is outside [0, ", world_size, ")");
  const Target t = parse_init_method(init_method);
  if (!t.file.empty()) return std::make_shared<FileStore>(t.file, world_size, timeout);
  return tcp_store(t.host, t.port, rank, world_size, timeout, t.source, tcp);
}

std::string address_toward_master(const std::string& init_method, const char* op) {
  const auto master = rendezvous_host(init_method);
  return master ? reachable_address(*master, op) : default_address(op);
}

std::optional<std::string> rendezvous_host(const std::string& init_method) {
  Target t = parse_init_method(init_method);
  if (!t.file.empty()) return std::nullopt;
  return std::move(t.host);
}

}  // namespace gw::store
