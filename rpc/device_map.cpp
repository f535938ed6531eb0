// Device maps: where CUDA tensors sent to another worker go (RpcBackendOptions::device_maps),
// checked when set, and the inverse maps that peers' handshakes carry for replies.
#include "rpc/agent.h"

namespace gw::rpc {

namespace {
// Throws unless `map` (toward worker `to`) names CUDA indices and is invertible.
void check_device_map(const std::string& to, const std::map<int, int>& map) {
  std::map<int, int> source_of;  // by target
  for (const auto& [from, dst] : map) {
    GW_CHECK(from >= 0 && dst >= 0 && from < kMaxDevices && dst < kMaxDevices, InvalidArgumentError,
             "[set_device_map] devices are CUDA indices in [0, ", kMaxDevices, "); got ", from,
             " -> ", dst, " toward '", to, "'");
    auto [it, fresh] = source_of.emplace(dst, from);
    GW_CHECK(fresh, InvalidArgumentError, "[set_device_map] the map toward '", to,
             "' would put cuda:", it->second, " and cuda:", from, " both on cuda:", dst,
             ": it must be invertible");
  }
}

}  // namespace

void RpcBackendOptions::set_device_map(const std::string& to, const std::map<int, int>& map) {
  auto known = device_maps.find(to);
  std::map<int, int> merged = known == device_maps.end() ? std::map<int, int>{} : known->second;
  for (const auto& [from, dst] : map) merged[from] = dst;
  check_device_map(to, merged);
  device_maps[to] = std::move(merged);
}

void Agent::load_device_maps() {
  maps_to_.resize(workers_.size());
  maps_back_.resize(workers_.size());
  for (const auto& [to, map] : options_.device_maps) {
    check_device_map(to, map);
    const int id = get_worker_info(to).id;
    for (const auto& [from, dst] : map) maps_to_[static_cast<size_t>(id)].emplace_back(from, dst);
  }
}

DeviceMap Agent::device_map_to(int peer, bool reply) {
  if (peer < 0) return {};
  if (!reply && !maps_to_[static_cast<size_t>(peer)].empty())
    return maps_to_[static_cast<size_t>(peer)];
  std::lock_guard lock(maps_mu_);
  return maps_back_[static_cast<size_t>(peer)];
}

}  // namespace gw::rpc
