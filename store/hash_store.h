// HashStore: a Store in this process's memory, for ranks that are threads of one process.
#pragma once

#include <condition_variable>
#include <mutex>
#include "store/store.h"
#include "store/store_util.h"

namespace gw::store {

class HashStore : public Store {
 public:
  using Store::set;
  using Store::Store;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  using Store::wait;

 private:
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Milliseconds timeout);

  std::mutex mu_;
  std::condition_variable changed_;
  KeyMap map_;
};

}  // namespace gw::store
