// The bookkeeping of the receiver's CUDA IPC mappings (core/ipc_cache.h), with a driver that
// only records what it is asked: which handles are open, and that none is opened twice.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include "core/ipc_cache.h"

using gw::detail::IpcMappingCache;

namespace {

struct FakeDriver {
  std::map<char*, int> open;  // base -> handle id, of what is open now
  int opens = 0, reopened_while_open = 0;
  std::vector<char> memory = std::vector<char>(512);

  // One address per (handle, device).
  char* base(int id, int device = 0) { return memory.data() + id * 2 + device; }

  IpcMappingCache::Driver driver() {
    return {[this](const IpcMappingCache::Handle& h, int device) {
              if (h[0] == 0xFF) throw std::runtime_error("cannot open");
              char* mapped = base(h[0], device);
              if (open.count(mapped)) ++reopened_while_open;
              open[mapped] = h[0];
              ++opens;
              return IpcMappingCache::Opened{mapped, static_cast<size_t>(100 + h[0])};
            },
            [this](char* mapped, int) { open.erase(mapped); }};
  }
};

IpcMappingCache::Handle handle(uint8_t id) {
  IpcMappingCache::Handle h{};
  h[0] = id;
  return h;
}

}  // namespace

TEST_CASE("an IPC mapping is opened once and reused while cached", "[ipc]") {
  FakeDriver d;
  IpcMappingCache cache(d.driver());
  char* first = nullptr;
  {
    auto m = cache.hold(handle(1), 0, 7);
    first = m->base;
    CHECK(m->size == 101);
  }
  CHECK(d.open.size() == 1);  // cached after its copy let go
  {
    auto m = cache.hold(handle(1), 0, 7);
    CHECK(m->base == first);
  }
  CHECK(d.opens == 1);
  // The same handle on another device is another mapping.
  { auto m = cache.hold(handle(1), 1, 7); }
  CHECK(d.opens == 2);
  // A handle that cannot be opened leaves nothing behind.
  CHECK_THROWS_WITH(cache.hold(handle(0xFF), 0, 7), Catch::Contains("cannot open"));
  CHECK(cache.open_count() == 2);
}

TEST_CASE("IPC mappings past the limits are evicted least recently used", "[ipc]") {
  FakeDriver d;
  IpcMappingCache cache(d.driver(), {.max_entries = 2, .max_bytes = 1000});
  { auto m = cache.hold(handle(1), 0, 7); }
  { auto m = cache.hold(handle(2), 0, 7); }
  { auto m = cache.hold(handle(1), 0, 7); }  // 2 is now the least recently used
  { auto m = cache.hold(handle(3), 0, 7); }
  CHECK(d.open.size() == 2);
  CHECK(d.open.count(d.base(2)) == 0);
  // Bytes: 101 + 103 + 110 > 300 evicts down to what fits.
  FakeDriver e;
  IpcMappingCache by_bytes(e.driver(), {.max_entries = 10, .max_bytes = 300});
  { auto m = by_bytes.hold(handle(1), 0, 7); }
  { auto m = by_bytes.hold(handle(3), 0, 7); }
  { auto m = by_bytes.hold(handle(10), 0, 7); }
  CHECK(e.open.size() == 2);
  CHECK(e.open.count(e.base(1)) == 0);
  // One mapping larger than the limit alone is still kept: it is in use.
  { auto m = by_bytes.hold(handle(250), 0, 7); }
  CHECK(by_bytes.open_count() == 1);
  CHECK(e.reopened_while_open == 0);
}

TEST_CASE("an evicted IPC mapping stays open while a copy holds it, and is not reopened", "[ipc]") {
  FakeDriver d;
  IpcMappingCache cache(d.driver(), {.max_entries = 1});
  std::optional<IpcMappingCache::Held> copying;
  copying.emplace(cache.hold(handle(1), 0, 7));
  { auto m = cache.hold(handle(2), 0, 7); }  // evicts 1, which the copy still reads
  CHECK(d.open.count(d.base(1)) == 1);
  // Another copy of 1 meanwhile reuses the open mapping (the driver would refuse a second open).
  { auto m = cache.hold(handle(1), 0, 7); }
  CHECK(d.reopened_while_open == 0);
  CHECK(d.opens == 2);
  copying.reset();
  // 1 is cached again (the last hold put it back), 2 was evicted by it.
  CHECK(d.open.size() == 1);
  CHECK(d.open.count(d.base(1)) == 1);
}

TEST_CASE("forgetting a sender closes its mappings once no copy holds them", "[ipc]") {
  FakeDriver d;
  IpcMappingCache cache(d.driver());
  { auto m = cache.hold(handle(1), 0, 7); }
  { auto m = cache.hold(handle(2), 0, 8); }
  std::optional<IpcMappingCache::Held> copying;
  copying.emplace(cache.hold(handle(3), 0, 7));
  cache.forget(7);
  CHECK(d.open.count(d.base(1)) == 0);
  CHECK(d.open.count(d.base(2)) == 1);  // another sender's
  CHECK(d.open.count(d.base(3)) == 1);  // still being copied from
  copying.reset();
  CHECK(d.open.count(d.base(3)) == 0);
  CHECK(cache.open_count() == 1);
}
