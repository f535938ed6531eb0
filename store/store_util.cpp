#include "store/store_util.h"

#include <charconv>

#include "core/error.h"

namespace gw::store {

int64_t parse_counter(const char* op, const std::string& key, const Bytes& value) {
  int64_t v = 0;
  auto first = reinterpret_cast<const char*>(value.data());
  auto last = first + value.size();
  auto [ptr, ec] = std::from_chars(first, last, v);
  GW_CHECK(ec == std::errc() && ptr == last && !value.empty(), InvalidArgumentError, "[", op,
           "] key '", key, "' holds '", std::string(first, last), "', not an integer counter");
  return v;
}

Bytes counter_bytes(int64_t value) {
  std::string s = std::to_string(value);
  return Bytes(s.begin(), s.end());
}

int64_t add_to_map(const char* op, KeyMap& map, const std::string& key, int64_t delta) {
  auto it = map.find(key);
  int64_t value = (it == map.end() ? 0 : parse_counter(op, key, it->second)) + delta;
  map[key] = counter_bytes(value);
  return value;
}

CompareSetResult compare_set_in_map(KeyMap& map, const std::string& key, const Bytes& expected,
                                    const Bytes& desired) {
  auto it = map.find(key);
  if (it == map.end()) {
    if (!expected.empty()) return {expected, false};
    map.emplace(key, desired);
    return {desired, true};
  }
  if (it->second != expected) return {it->second, false};
  it->second = desired;
  return {desired, true};
}

bool map_has_all(const KeyMap& map, const std::vector<std::string>& keys) {
  for (const auto& k : keys)
    if (!map.contains(k)) return false;
  return true;
}

std::string wait_timeout_message(const char* op, const std::vector<std::string>& keys,
                                 Milliseconds timeout,
                                 const std::function<bool(const std::string&)>& present) {
  std::string all, missing;
  for (const auto& k : keys) {
    all += (all.empty() ? "" : ", ") + k;
    if (!present(k)) missing += (missing.empty() ? "" : ", ") + k;
  }
  return detail::str("[", op, "] timed out after ", timeout.count(), " ms waiting for keys: ", all,
                     " (missing: ", missing, ")");
}

}  // namespace gw::store
