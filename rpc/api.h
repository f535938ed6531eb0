// The RPC API of torch.distributed.rpc, in C++.
//
//   // On every worker (same registration code everywhere):
//   Tensor my_add(Tensor a, Tensor b) { return a + b; }
//   GW_RPC_FUNCTION(my_add);
//
//   gw::rpc::init_rpc("worker{rank}");   // rank, world size, master from gwrun/srun/mpirun/...
//   Tensor r = gw::rpc::rpc_sync("worker1", my_add, gw::ones({2}), gw::ones({2}));
//   auto fut = gw::rpc::rpc_async<Tensor>("worker1", "add", gw::ones({2}), 3);  // builtin
//   auto m = gw::rpc::rpc_async<int64_t>(1, "min", 1, 2);   // by rank
//   Tensor s = fut.wait() + m.wait();
//   gw::rpc::rpc_sync("worker1", my_add, a, b, gw::rpc::timeout(std::chrono::seconds(5)));
//   gw::rpc::shutdown();                                   // waits for everyone
//
// A function is named either by its pointer (the result type is deduced; it must have been
// registered) or by its registered name (then the result type is the template argument,
// IValue by default). A trailing gw::rpc::timeout(...) overrides the default timeout for the
// call; timeout(0ms) waits forever. Inside a request handler these functions use the agent
// that runs the handler; elsewhere the process's agent from init_rpc.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "rpc/agent.h"
#include "rpc/function_table.h"

namespace gw::rpc {

// Creates this process's agent (see Agent). Throws StateError if RPC is already initialized.
void init_rpc(const std::string& name, int rank, int world_size, RpcBackendOptions options = {});
// The same, with the rank and world size of whichever launcher started this process (gwrun,
// torchrun, srun, mpirun, a PyTorchJob: store/launch_env.h); "{rank}" in `name` becomes
// the rank. With the default init_method ("env://"), the rendezvous is the launcher's master.
//   gw::rpc::init_rpc("worker{rank}");
void init_rpc(const std::string& name, RpcBackendOptions options = {});
// Shuts the process's agent down (graceful, timeout: see Agent::shutdown) and destroys it, also
// when the graceful part fails (then it throws after).
void shutdown(bool graceful = true, Milliseconds timeout = kNoTimeout);

// The agent calls go through: the current handler's, else the process's; StateError if none.
Agent& current_agent();

WorkerInfo get_worker_info();
WorkerInfo get_worker_info(const std::string& worker_name);
std::vector<WorkerInfo> get_worker_infos();
void set_rpc_timeout(Milliseconds timeout);
Milliseconds get_rpc_timeout();

// A per-call timeout, passed as the last argument of rpc_sync / rpc_async.
struct CallTimeout {
  Milliseconds value;
};
template <typename Rep, typename Period>
CallTimeout timeout(std::chrono::duration<Rep, Period> d) {
  return {std::chrono::duration_cast<Milliseconds>(d)};
}

namespace detail {
struct CallArgs {
  IValueList args;
  Milliseconds timeout = kUseDefaultTimeout;
};
template <typename... Args>
CallArgs pack(Args&&... args) {
  CallArgs out;
  [[maybe_unused]] auto one = [&](auto&& a) {
    if constexpr (std::is_same_v<std::decay_t<decltype(a)>, CallTimeout>)
      out.timeout = a.value;
    else
      out.args.push_back(to_ivalue(a));
  };
  (one(std::forward<Args>(args)), ...);
  return out;
}
// Sends the call through this thread's agent; its future holds the result as an IValue.
template <typename... Args>
Future<IValue> start(const To& to, const std::string& function, Args&&... args) {
  CallArgs call = pack(std::forward<Args>(args)...);
  return current_agent().call(to, function, std::move(call.args), call.timeout);
}
// A call's result as the caller's type R (void: nothing).
template <typename R>
R result_as(IValue v) {
  if constexpr (std::is_same_v<R, IValue>) {
    return v;
  } else if constexpr (!std::is_void_v<R>) {
    GW_CHECK(IValueTraits<R>::accepts(v), InvalidArgumentError, "[rpc] expected a result of type ",
             IValueTraits<R>::name(), ", got ", v.kind_name());
    return IValueTraits<R>::from(v);
  }
}
template <typename R>
Future<R> typed(Future<IValue> f) {
  if constexpr (std::is_same_v<R, IValue>) {
    return f;
  } else {
    return f.then([](Future<IValue>& done) -> R { return result_as<R>(done.wait()); });
  }
}
}  // namespace detail

template <typename R = IValue, typename... Args>
Future<R> rpc_async(const To& to, const std::string& function, Args&&... args) {
  return detail::typed<R>(detail::start(to, function, std::forward<Args>(args)...));
}

template <typename R, typename... P, typename... Args>
Future<rpc_result_t<R>> rpc_async(const To& to, R (*fn)(P...), Args&&... args) {
  return rpc_async<rpc_result_t<R>>(to, functions().name_of(reinterpret_cast<const void*>(fn)),
                                    std::forward<Args>(args)...);
}

// Waits on the call's own future and converts its result here, on the caller's thread: no
// second future to complete, nothing converted on the thread that read the response.
template <typename R = IValue, typename... Args>
R rpc_sync(const To& to, const std::string& function, Args&&... args) {
  return detail::result_as<R>(detail::start(to, function, std::forward<Args>(args)...).wait());
}

template <typename R, typename... P, typename... Args>
rpc_result_t<R> rpc_sync(const To& to, R (*fn)(P...), Args&&... args) {
  return rpc_sync<rpc_result_t<R>>(to, functions().name_of(reinterpret_cast<const void*>(fn)),
                                   std::forward<Args>(args)...);
}

}  // namespace gw::rpc
