// PrefixStore: a namespace inside another Store; every key becomes "prefix/key".
//
// Lets independent users (several process groups, RPC and DDP) share one rendezvous store
// without their keys colliding. num_keys() reports the underlying store's count, as PyTorch.
//
//   auto base = std::make_shared<gw::store::HashStore>();
//   gw::store::PrefixStore pg0("pg0", base);
//   pg0.set("ready", "1");          // base now holds "pg0/ready"
#pragma once

#include <memory>
#include <string>

#include "store/store.h"

namespace gw::store {

class PrefixStore : public Store {
 public:
  // Takes the underlying store's timeout; throws InvalidArgumentError if `store` is null.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  int64_t add_within(const std::string& key, int64_t delta, Milliseconds timeout) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying_store() const { return store_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace gw::store
