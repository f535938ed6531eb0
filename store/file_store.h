// FileStore: a Store kept in one file that several processes (or threads) share.
//
// Every operation opens the file, takes flock() (shared to read, exclusive to change) and
// reads the whole map; changes write the whole map back before the lock is released. `get`
// and `wait` poll the file with a short backoff (1 ms growing to 20 ms) until their deadline.
// Meant for rendezvous on one machine or a shared filesystem with working flock, not for
// heavy traffic.
//
//   gw::store::FileStore store("/tmp/job42.store", world_size);
//   store.set("rank/" + std::to_string(rank), "ready");
//   store.wait({"rank/0", "rank/1"});
#pragma once

#include <string>

#include "store/store.h"
#include "store/store_util.h"

namespace gw::store {

class FileStore : public Store {
 public:
  // Creates the file if needed; throws gw::IoError naming the path if it cannot be opened.
  explicit FileStore(std::string path, int world_size = -1,
                     Milliseconds timeout = kDefaultStoreTimeout);

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;

  const std::string& path() const { return path_; }
  int world_size() const { return world_size_; }

 private:
  // Polls until every key exists and returns the map that had them all.
  KeyMap wait_for(const char* op, const std::vector<std::string>& keys, Milliseconds timeout);

  std::string path_;
  int world_size_;
};

}  // namespace gw::store
