#include "tests/store/store_test_util.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "store/file_store.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"

namespace gw::store::test {

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gw_store_test_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

StoreUnderTest::StoreUnderTest(const std::string& kind, milliseconds timeout)
    : kind_(kind), timeout_(timeout) {
  if (kind == "hash") {
    store_ = std::make_shared<HashStore>(timeout);
  } else if (kind == "file") {
    dir_ = std::make_unique<TempDir>();
    store_ = std::make_shared<FileStore>(dir_->path() + "/store", 2, timeout);
  } else if (kind == "tcp") {
    store_ = std::make_shared<TCPStore>("127.0.0.1", 0, 2, true, timeout);
  } else if (kind == "prefix") {
    base_ = std::make_shared<HashStore>(timeout);
    store_ = std::make_shared<PrefixStore>("pg0", base_);
  } else {
    throw std::invalid_argument("unknown store kind " + kind);
  }
}

StoreUnderTest::~StoreUnderTest() = default;

std::shared_ptr<Store> StoreUnderTest::open_another() {
  if (kind_ == "file")
    return std::make_shared<FileStore>(dynamic_cast<FileStore&>(*store_).path(), 2, timeout_);
  if (kind_ == "tcp")
    return std::make_shared<TCPStore>("127.0.0.1", dynamic_cast<TCPStore&>(*store_).port(), 2,
                                      false, timeout_);
  if (kind_ == "prefix") return std::make_shared<PrefixStore>("pg0", base_);
  return store_;  // hash: threads share the one object
}

std::string StoreUnderTest::shown_key(const std::string& key) const {
  return kind_ == "prefix" ? "pg0/" + key : key;
}

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

void ThreadGroup::spawn(std::function<void()> fn) {
  threads_.emplace_back([this, fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::exception& e) {
      std::lock_guard lock(mu_);
      errors_.push_back(e.what());
    }
  });
}

std::vector<std::string> ThreadGroup::join() {
  for (auto& t : threads_) t.join();
  threads_.clear();
  return errors_;
}

SilentListener::SilentListener() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd_, 16) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error(std::string("SilentListener: ") + std::strerror(errno));
  port_ = ntohs(addr.sin_port);
}

SilentListener::~SilentListener() { ::close(fd_); }

MuteServer::MuteServer()
    : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}),
      port_(acceptor_.local_endpoint().port()) {
  door_.emplace(acceptor_,
                auth::Gatekeeper::Options{JobKey::none(),
                                          auth::Purpose::kStore,
                                          {"store", -1},
                                          std::chrono::milliseconds(10000),
                                          16,
                                          "MuteServer",
                                          nullptr},
                [this](std::shared_ptr<Stream> s, const auth::Identity&, const std::string&) {
                  held_.push_back(std::move(s));
                });
  door_->start();
  thread_ = std::thread([this] { io_.run(); });
}

MuteServer::~MuteServer() {
  asio::post(io_, [this] {
    door_->stop();
    held_.clear();
  });
  thread_.join();
}

}  // namespace gw::store::test
