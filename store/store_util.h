// Helpers shared by the Store implementations: counters as decimal text, the map operations
// with PyTorch's semantics (HashStore, FileStore and the TCPStore server all keep a map),
// timeout messages.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/store.h"

namespace gw::store {

// The value of a counter key; throws InvalidArgumentError if it is not a decimal int64.
int64_t parse_counter(const char* op, const std::string& key, const Bytes& value);
Bytes counter_bytes(int64_t value);

using KeyMap = std::unordered_map<std::string, Bytes>;

// Store::add on a map: adds `delta` to the counter at `key` (absent = 0), returns the new value.
int64_t add_to_map(const char* op, KeyMap& map, const std::string& key, int64_t delta);

struct CompareSetResult {
  Bytes value;   // the value after the operation, as Store::compare_set returns it
  bool swapped;  // whether the map changed
};
// Store::compare_set on a map. A missing key counts as equal to an empty `expected`; with a
// non-empty `expected` it answers `expected` and sets nothing (PyTorch's behaviour).
CompareSetResult compare_set_in_map(KeyMap& map, const std::string& key, const Bytes& expected,
                                    const Bytes& desired);

bool map_has_all(const KeyMap& map, const std::vector<std::string>& keys);

// "[op] timed out after 30000 ms waiting for keys: a, b (missing: b)"
std::string wait_timeout_message(const char* op, const std::vector<std::string>& keys,
                                 Milliseconds timeout,
                                 const std::function<bool(const std::string&)>& present);

}  // namespace gw::store
