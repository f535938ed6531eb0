// Helpers for the Store tests: one fixture that builds every Store implementation the same
// way (so the contract tests run over all of them), temp directories, child processes and raw
// sockets.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "store/handshake.h"
#include "store/store.h"
#include "tests/process_util.h"

namespace gw::store::test {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The Store implementations under test; each kind names one StoreUnderTest setup.
inline const std::vector<std::string> kStoreKinds = {"hash", "file", "tcp", "prefix"};

// One store of the given kind, plus the way to open a second handle on the same data (another
// FileStore on the file, another TCPStore client, ...), as a second rank would.
class StoreUnderTest {
 public:
  StoreUnderTest(const std::string& kind, milliseconds timeout);
  ~StoreUnderTest();

  Store& store() { return *store_; }
  std::shared_ptr<Store> open_another();
  // How a key appears in error messages: PrefixStore errors name the underlying "pg0/key".
  std::string shown_key(const std::string& key) const;

 private:
  std::string kind_;
  milliseconds timeout_;
  std::unique_ptr<TempDir> dir_;
  std::shared_ptr<Store> base_;   // prefix: the underlying store
  std::shared_ptr<Store> store_;  // the one under test
};

Bytes bytes(const std::string& s);

// Threads whose exceptions become messages for the test to check, instead of std::terminate.
class ThreadGroup {
 public:
  ~ThreadGroup() { join(); }
  void spawn(std::function<void()> fn);
  // Joins every thread; the what() of each exception that escaped one.
  std::vector<std::string> join();

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

using gw::test::spawn;
using gw::test::wait_exit;

// A socket listening on 127.0.0.1 that never accepts nor answers: a stuck server.
class SilentListener {
 public:
  SilentListener();
  ~SilentListener();
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A store server that proves the (absent) job key to its clients and then never answers them:
// a server that hangs after accepting.
class MuteServer {
 public:
  MuteServer();
  ~MuteServer();
  uint16_t port() const { return port_; }

 private:
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  uint16_t port_;
  std::optional<auth::Gatekeeper> door_;
  std::vector<std::shared_ptr<Stream>> held_;  // server thread only
  std::thread thread_;
};

}  // namespace gw::store::test
