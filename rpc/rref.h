// gw::rpc::RRef<T> — a reference to a value of type T that lives on one worker, its owner.
//
// Mental model (torch.distributed.rpc.RRef): remote() runs a function on another worker, which
// keeps the result and owns it; the caller gets an RRef, a distributed shared pointer. Copies
// of an RRef, and RRefs passed in RPC arguments or results to any worker, keep the value alive;
// when the last reference anywhere is gone the owner drops it (rpc/rref_context.h has the
// protocol). to_here() copies the value to the caller; the helpers run a registered method of
// the owner's object on the owner, with the object as `self`.
//
//   struct Counter { int64_t n = 0; int64_t add(int64_t k) { return n += k; } };
//   gw::rpc::functions().add_class<Counter>("Counter").add_method("add", &Counter::add);
//   gw::rpc::functions().add("make_counter", [] { return std::make_shared<Counter>(); });
//
//   auto x = gw::rpc::remote<Tensor>("worker1", "add", gw::ones({2}), 3);
//   Tensor t = x.to_here();                                    // tensor([4., 4.])
//   auto c = gw::rpc::remote<std::shared_ptr<Counter>>("worker1", "make_counter");
//   c.rpc_sync(&Counter::add, 5);                              // runs on worker1: 5
//   int64_t n = c.rpc_async<int64_t>("add", 2).wait();         // 7
//   gw::rpc::RRef<Tensor> mine(gw::ones({3}));                 // a local RRef: we own it
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include "rpc/api.h"
#include "rpc/autograd_hook.h"
#include "rpc/rref_context.h"

namespace gw::rpc {

namespace detail {
template <typename M>
struct MethodResult;
template <typename C, typename R, typename... A>
struct MethodResult<R (C::*)(A...)> {
  using type = rpc_result_t<R>;
};
template <typename C, typename R, typename... A>
struct MethodResult<R (C::*)(A...) const> {
  using type = rpc_result_t<R>;
};
}  // namespace detail
template <typename M>
using method_result_t = typename detail::MethodResult<M>::type;

template <typename T>
class RRef {
 public:
  RRef() = default;
  explicit RRef(std::shared_ptr<RRefHandle> handle) : h_(std::move(handle)) {}
  // A local RRef: this worker owns `value`.
  explicit RRef(const T& value)
      : h_(current_agent().rrefs().create_owner(Future<IValue>::ready(to_ivalue(value)))) {}

  bool is_owner() const { return handle().is_owner(); }
  WorkerInfo owner() const { return current_agent().get_worker_info(handle().owner()); }
  std::string owner_name() const { return owner().name; }
  // Whether the owner has acknowledged this reference.
  bool confirmed_by_owner() const {
    const auto& c = handle().confirmed();
    return c.done() && !c.has_error();
  }

  // Copies the value here (on the owner: returns it). Raises the creating call's error, and
  // TimeoutError if the fetch takes longer than `timeout`.
  T to_here(Milliseconds timeout = kUseDefaultTimeout) const {
    return detail::typed<T>(current_agent().fetch(h_, timeout)).wait();
  }
  // The value itself; only on the owner.
  T local_value() const {
    GW_CHECK(is_owner(), StateError, "[RRef::local_value] only the owner (worker ",
             handle().owner(), ") holds the value; use to_here() elsewhere");
    return IValueTraits<T>::from(handle().owner_state()->value.wait());
  }

  // Run a registered method of the owner's object on the owner: by name ("add" for a class
  // registered as "Counter" runs "Counter.add") or by member pointer.
  template <typename R = IValue, typename... Args>
  Future<R> rpc_async(const std::string& method, Args&&... args) const {
    return gw::rpc::rpc_async<R>(handle().owner(), method_of(method), *this,
                                 std::forward<Args>(args)...);
  }
  template <typename M, typename... Args>
  requires std::is_member_function_pointer_v<M>
  auto rpc_async(M m, Args&&... args) const {
    return gw::rpc::rpc_async<method_result_t<M>>(handle().owner(), functions().method_name(m),
                                                  *this, std::forward<Args>(args)...);
  }
  template <typename R = IValue, typename... Args>
  R rpc_sync(const std::string& method, Args&&... args) const {
    return rpc_async<R>(method, std::forward<Args>(args)...).wait();
  }
  template <typename M, typename... Args>
  requires std::is_member_function_pointer_v<M>
  auto rpc_sync(M m, Args&&... args) const {
    return rpc_async(m, std::forward<Args>(args)...).wait();
  }
  // Runs backward from the value (a scalar tensor) on its owner: a distributed backward pass
  // in `context_id`, or local autograd there (gradients in the owner's .grad) when it is 0.
  void backward(uint64_t context_id = 0, bool retain_graph = false) const
  requires std::is_same_v<T, Tensor> {
    if (is_owner()) {
      AutogradHook* hook = current_agent().autograd_hook();
      GW_CHECK(hook, StateError,
               "[RRef::backward] this agent has no distributed autograd: start RPC with "
               "gw::dist::init_rpc (dist/init_rpc.h)");
      hook->backward(context_id, {local_value()}, retain_graph).wait();
    } else {
      current_agent()
          .request(handle().owner(), AutogradBackward{IValue::rref(h_), context_id, retain_graph})
          .wait();
    }
  }

  // Like rpc_async, but the result stays on the owner: returns an RRef to it.
  template <typename R = IValue, typename... Args>
  RRef<R> remote(const std::string& method, Args&&... args) const;

  const RRefHandle& handle() const {
    GW_CHECK(h_, StateError, "[RRef] this RRef is empty");
    return *h_;
  }
  const std::shared_ptr<RRefHandle>& handle_ptr() const { return h_; }

 private:
  std::string method_of(const std::string& method) const {
    return IValueTraits<T>::name() + "." + method;
  }
  std::shared_ptr<RRefHandle> h_;
};

template <typename T>
struct IValueTraits<RRef<T>> {
  static IValue to(const RRef<T>& r) { return IValue::rref(r.handle_ptr()); }
  static bool accepts(const IValue& v) { return v.is(IValue::Kind::kRRef); }
  static RRef<T> from(const IValue& v) { return RRef<T>(v.to_rref()); }
  static std::string name() { return "RRef[" + IValueTraits<T>::name() + "]"; }
};

// Runs `function` on `to`, which owns the result; returns an RRef to it at once. A trailing
// gw::rpc::timeout(...) bounds the creation; its failure surfaces on to_here().
template <typename R = IValue, typename... Args>
RRef<R> remote(const To& to, const std::string& function, Args&&... args) {
  auto call = detail::pack(std::forward<Args>(args)...);
  return RRef<R>(current_agent().remote(to, function, std::move(call.args), call.timeout));
}

template <typename R, typename... P, typename... Args>
RRef<rpc_result_t<R>> remote(const To& to, R (*fn)(P...), Args&&... args) {
  return remote<rpc_result_t<R>>(to, functions().name_of(reinterpret_cast<const void*>(fn)),
                                 std::forward<Args>(args)...);
}

template <typename T>
template <typename R, typename... Args>
RRef<R> RRef<T>::remote(const std::string& method, Args&&... args) const {
  return gw::rpc::remote<R>(handle().owner(), method_of(method), *this,
                            std::forward<Args>(args)...);
}

}  // namespace gw::rpc
