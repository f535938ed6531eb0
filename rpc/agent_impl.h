// The agent's private state, shared by its source files: agent.cpp (setup, calls, serving,
// shutdown), agent_connections.cpp (connections, and the device maps their handshakes carry)
// and agent_rrefs.cpp. Not installed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <asio.hpp>

#include "rpc/agent.h"
#include "rpc/connection.h"
#include "rpc/thread_pool.h"

namespace gw::rpc {

// A call waiting for its response.
struct PendingCall {
  Future<IValue> future;
  int peer;
  std::string what;                  // describe(request): "call of 'f'", "RRef fetch", ...
  Milliseconds timeout{0};           // 0: none
  const Connection* conn = nullptr;  // where the request went; its loss fails the call
  std::multimap<std::chrono::steady_clock::time_point, uint64_t>::iterator deadline;
};

struct Agent::Impl {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  asio::ip::tcp::acceptor acceptor{io};
  std::thread io_thread;
  std::unique_ptr<ThreadPool> pool;
  std::shared_ptr<dist::Store> store;
  std::vector<asio::ip::tcp::endpoint> endpoints;  // by worker id

  std::mutex conn_mu;
  std::vector<std::shared_ptr<Connection>> outbound;  // by worker id
  // One connect at a time per peer: connecting[id] is set while one is under way, and the
  // others wait on connect_done. (Not a timed_mutex: TSan misses its timed lock.)
  std::vector<char> connecting;  // by worker id
  std::condition_variable connect_done;
  std::set<std::shared_ptr<Connection>> inbound;

  std::mutex pending_mu;
  std::condition_variable idle;  // pending empty / no handler running
  std::unordered_map<uint64_t, PendingCall> pending;
  // Deadlines of the pending calls that have one, and the one timer that fires at the earliest.
  // A new call touches the timer only if its deadline is the new earliest, which keeps timer
  // syscalls and network-thread wake-ups off the common path.
  std::multimap<std::chrono::steady_clock::time_point, uint64_t> deadlines;
  std::chrono::steady_clock::time_point armed_for = std::chrono::steady_clock::time_point::max();
  asio::steady_timer timer{io};
  int active_handlers = 0;
  std::atomic<uint64_t> stray_responses{0};  // see Agent::response_fate
  std::atomic<uint64_t> next_id{1};

  uint64_t max_frame_bytes = 0;
  std::vector<DeviceMap> maps_to;  // by worker id: options.device_maps
  std::mutex maps_mu;
  std::vector<DeviceMap> maps_back;       // by worker id: the inverse of its map to us (handshake)
  Connection::MessageHandler on_message;  // both to the agent
  Connection::CloseHandler on_close;

  PendingCall take_pending_locked(std::unordered_map<uint64_t, PendingCall>::iterator it);
  // Fails a call with E("[rpc] <what the request is> on worker 'w' <what happened>").
  template <typename E>
  static void fail(PendingCall& p, const std::string& worker, const std::string& what) {
    p.future.set_exception(std::make_exception_ptr(
        E(gw::detail::str("[rpc] ", p.what, " on worker '", worker, "' ", what))));
  }
  std::shared_ptr<Connection> make_connection(asio::ip::tcp::socket socket);
};

// Throws unless `map` (toward worker `to`) names CUDA indices and is invertible.
void check_device_map(const std::string& to, const std::map<int, int>& map);

}  // namespace gw::rpc
