#include "store/hash_store.h"

#include "core/error.h"
#include "store/store_util.h"

namespace gw::store {

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    map_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  // Wait and read under one lock: a delete_key in between must not turn into out_of_range.
  std::unique_lock lock(mu_);
  wait_locked(lock, {key}, timeout());
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t value;
  {
    std::lock_guard lock(mu_);
    value = add_to_map("HashStore::add", map_, key, delta);
  }
  changed_.notify_all();
  return value;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  CompareSetResult result;
  {
    std::lock_guard lock(mu_);
    result = compare_set_in_map(map_, key, expected, desired);
  }
  if (result.swapped) changed_.notify_all();
  return std::move(result.value);
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return map_has_all(map_, keys);
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard lock(mu_);
  return map_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(map_.size());
}

void HashStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  std::unique_lock lock(mu_);
  wait_locked(lock, keys, timeout);
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::string>& keys, Milliseconds timeout) {
  if (!changed_.wait_for(lock, timeout, [&] { return map_has_all(map_, keys); }))
    throw TimeoutError(wait_timeout_message(
        "HashStore::wait", keys, timeout, [&](const std::string& k) { return map_.contains(k); }));
}

}  // namespace gw::store
