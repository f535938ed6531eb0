// Identifiers of the RRef protocol: which value (RRefId) and which reference to it (ForkId).
// Both are globally unique: the worker that created them plus a counter of that worker.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace gw::rpc {

struct GloballyUniqueId {
  int32_t worker = -1;
  int64_t local = -1;
  auto operator<=>(const GloballyUniqueId&) const = default;
};
using RRefId = GloballyUniqueId;
using ForkId = GloballyUniqueId;

// What travels on the wire when an RRef is passed to another worker: a new fork of the value,
// and the worker that made it (which keeps the value alive until the receiver accepts it).
struct RRefForkData {
  int32_t owner = -1;
  RRefId rref_id;
  ForkId fork_id;
  int32_t parent = -1;
};

class RRefHandle;  // a worker's reference to one fork of a value (rpc/rref_context.h)

// A local C++ object kept in an IValue (an owner's RRef value: a module, a class instance).
// Objects never travel: only an RRef to them does.
struct Object {
  std::shared_ptr<void> ptr;
  const std::type_info* type = nullptr;
  std::string type_name;
};

}  // namespace gw::rpc
