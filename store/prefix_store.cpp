#include "store/prefix_store.h"

#include "core/error.h"

namespace gw::store {

namespace {
const std::shared_ptr<Store>& checked(const std::shared_ptr<Store>& store,
                                      const std::string& prefix) {
  GW_CHECK(store != nullptr, InvalidArgumentError, "[PrefixStore] prefix '", prefix,
           "' given a null store");
  return store;
}
}  // namespace

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(checked(store, prefix)->timeout()),
      prefix_(std::move(prefix)),
      store_(std::move(store)) {}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

void PrefixStore::set(const std::string& k, const Bytes& value) { store_->set(key(k), value); }

Bytes PrefixStore::get(const std::string& k) {
  // Wait with this store's timeout (set_timeout may differ from the underlying one).
  store_->wait({key(k)}, timeout());
  return store_->get(key(k));
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }
int64_t PrefixStore::add_within(const std::string& k, int64_t delta, Milliseconds timeout) {
  return store_->add_within(key(k), delta, timeout);
}

Bytes PrefixStore::compare_set(const std::string& k, const Bytes& expected, const Bytes& desired) {
  return store_->compare_set(key(k), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& ks) { return store_->check(keys(ks)); }

bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }

int64_t PrefixStore::num_keys() { return store_->num_keys(); }

void PrefixStore::wait(const std::vector<std::string>& ks, Milliseconds timeout) {
  store_->wait(keys(ks), timeout);
}

}  // namespace gw::store
