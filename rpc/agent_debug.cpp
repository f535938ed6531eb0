// The agent's section of get_debug_info() (debug/flight_recorder.h), which gwrun's hang
// doctor reads (debug/doctor.h): who this worker waits for, and how busy its pool is.
#include <nlohmann/json.hpp>

#include "rpc/agent.h"
#include "rpc/call_table.h"
#include "rpc/dispatcher.h"
#include "rpc/rref_context.h"

namespace gw::rpc {

std::string Agent::debug_json() const {
  nlohmann::json j;
  j["worker"] = self_.name;
  j["id"] = self_.id;
  j["running"] = running_.load();
  const Dispatcher::Load load = dispatcher_->load();
  j["threads"] = load.threads;
  j["busy"] = load.busy;
  j["queued"] = load.queued;
  auto& calls = j["pending_calls"] = nlohmann::json::array();
  for (const auto& c : calls_->pending_calls())
    calls.push_back(
        {{"id", c.id}, {"to", workers_[c.peer].name}, {"what", c.what}, {"age_ms", c.age_ms}});
  auto& serving = j["serving"] = nlohmann::json::object();
  for (const auto& w : workers_)
    if (const int n = serving_[static_cast<size_t>(w.id)].load(); n > 0) serving[w.name] = n;
  const RRefContext::Sizes rrefs = rrefs_->sizes();
  j["rrefs"] = {{"owned", rrefs.owned},
                {"users", rrefs.users},
                {"children_unaccepted", rrefs.children_unaccepted}};
  return j.dump();
}

}  // namespace gw::rpc
