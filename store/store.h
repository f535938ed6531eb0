// gw::store::Store — a small key-value store that processes use to find each other.
//
// Mental model (PyTorch's c10d Store): every rank of a job talks to the same store. Values are
// bytes; `get` and `wait` block until the keys exist or the store's timeout passes (then they
// throw gw::TimeoutError naming the keys); `add` keeps an int64 counter stored as decimal text,
// so it composes with `get`. Implementations: HashStore (one process, threads as ranks),
// FileStore (a shared file), TCPStore (a server inside rank 0's process, clients elsewhere) and
// PrefixStore (a namespace inside another store). `rendezvous` builds one from an init method.
//
//   auto store = gw::store::rendezvous("tcp://127.0.0.1:29500", rank, world_size);
//   store->set("addr/" + std::to_string(rank), my_address);
//   store->wait({"addr/0", "addr/1"});
//   int64_t arrived = store->add("barrier", 1);
//
// Store sits at the bottom of dist: rpc uses it for rendezvous, so it is its own library
// (gw_store) below rpc.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gw::store {

using Bytes = std::vector<uint8_t>;
using Milliseconds = std::chrono::milliseconds;

// PyTorch's default store timeout.
inline constexpr Milliseconds kDefaultStoreTimeout{std::chrono::minutes(5)};

class Store {
 public:
  explicit Store(Milliseconds timeout = kDefaultStoreTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits for `key` up to timeout(), then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the counter at `key` (absent = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // add() that gives up after `timeout` (TimeoutError/IoError) whatever the store's own timeout:
  // for liveness checks, which must notice a silent store. Stores in this process never wait.
  virtual int64_t add_within(const std::string& key, int64_t delta, Milliseconds timeout) {
    (void)timeout;
    return add(key, delta);
  }
  // Sets `key` to `desired` if its value is `expected` (absent counts as equal to an empty
  // `expected`); returns the value after the operation.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // True if every key exists now; never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes `key`; true if it existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;
  // Blocks until every key exists; throws gw::TimeoutError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, Milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // String conveniences over the byte API.
  void set(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds timeout) { timeout_ = timeout; }

 private:
  Milliseconds timeout_;
};

}  // namespace gw::store
