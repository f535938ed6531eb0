// The function table: what a worker may run on behalf of another, by name.
//
// RPC never runs arbitrary code: a callee runs only functions registered here under a name, and
// every worker runs the same registration code (static registrars or code before init_rpc). A
// name may have several overloads (builtin `add` takes (Tensor, Tensor) and (Tensor, Scalar));
// the first whose parameters accept the arguments runs. A function returning gw::Future<T> runs
// with async execution: the worker thread is released and the response is sent when the
// future completes, so nested RPCs cannot starve the pool.
//
// A function runs on the callee's pool of handler threads, unless it is registered to run
// inline: then the thread that read the request runs it and sends the answer, saving a hand-off
// between threads. That is for functions that only compute on their arguments, within
// microseconds: the thread reads every connection, so an inline function must never block, and
// may not wait on a future (rpc_sync, to_here: they throw StateError, since the answer would
// come to this very thread). It runs on the pool after all when its call brings CUDA tensors,
// RRefs or a distributed autograd context.
//
//   Tensor my_add(Tensor a, Tensor b) { return a + b; }
//   GW_RPC_FUNCTION(my_add);                                // registers "my_add"
//   gw::rpc::functions().add("scale", [](Tensor t, double s) { return t * s; });
//   int64_t twice(int64_t x) { return 2 * x; }
//   GW_RPC_INLINE_FUNCTION(twice);                          // runs where it is read
//
// The table is process-wide, like PyTorch's operator registry: code identity is a property of
// the program, not of an agent. Builtin tensor ops are registered on first use.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/future.h"
#include "rpc/ivalue.h"

namespace gw::rpc {

template <typename T>
struct UnwrapFuture {
  using type = T;
};
template <typename T>
struct UnwrapFuture<Future<T>> {
  using type = T;
};
// What a caller receives from a function returning R (async functions: the future's value).
template <typename R>
using rpc_result_t = typename UnwrapFuture<std::decay_t<R>>::type;

// Where the callee runs a function (see the top of this file).
enum class Runs {
  kOnPool,  // on the agent's handler threads
  kInline,  // on the thread that read the request: it must not block, nor wait on a future
};

class FunctionTable {
 public:
  using Invoker = std::function<Future<IValue>(const IValueList& args)>;

  struct Overload {
    std::string signature;  // "my_add(Tensor, Tensor) -> Tensor"
    std::function<bool(const IValueList&)> accepts;
    Invoker invoke;
    Runs runs = Runs::kOnPool;
  };

  // Registers `fn` (function pointer, lambda or std::function) under `name`, as an overload.
  template <typename F>
  void add(const std::string& name, F fn, Runs runs = Runs::kOnPool) {
    add_overload(name, make_overload(name, std::function(std::move(fn)), runs));
  }
  // Same, and remembers the pointer so callers may pass `fn` itself instead of its name.
  template <typename R, typename... A>
  void add(const std::string& name, R (*fn)(A...), Runs runs = Runs::kOnPool) {
    add_overload(name, make_overload(name, std::function<R(A...)>(fn), runs));
    std::lock_guard lock(mu_);
    names_[reinterpret_cast<const void*>(fn)] = name;
  }

  // Names class C (its objects live on RRef owners) for methods and messages.
  template <typename C>
  FunctionTable& add_class(const std::string& name) {
    std::lock_guard lock(mu_);
    class_names_[std::type_index(typeid(C))] = name;
    return *this;
  }
  // Registers `name(A...)` creating a C on the worker that runs it, for remote(): the object
  // stays there and the caller gets an RRef to it.
  template <typename C, typename... A>
  FunctionTable& add_constructor(const std::string& name) {
    add(name, std::function<std::shared_ptr<C>(A...)>(
                  [](A... a) { return std::make_shared<C>(std::forward<A>(a)...); }));
    return *this;
  }
  // Registers C::method as "<class name>.<method>", callable through RRef helpers with the
  // owner's object as `self`.
  template <typename C, typename R, typename... A>
  FunctionTable& add_method(const std::string& method, R (C::*m)(A...)) {
    return add_method_impl<C, R, A...>(
        method, m, [m](C& self, A... a) -> R { return (self.*m)(std::forward<A>(a)...); });
  }
  template <typename C, typename R, typename... A>
  FunctionTable& add_method(const std::string& method, R (C::*m)(A...) const) {
    return add_method_impl<C, R, A...>(
        method, m, [m](C& self, A... a) -> R { return (self.*m)(std::forward<A>(a)...); });
  }
  std::string class_name(const std::type_info& type) const;
  // The registered name of a method; throws InvalidArgumentError if it never was.
  template <typename M>
  std::string method_name(M m) const {
    return name_of_key(member_key(m), "method");
  }

  // The name `fn` was registered under; throws InvalidArgumentError if it never was.
  std::string name_of(const void* fn) const;
  bool contains(const std::string& name) const;
  // The first overload of `name` that accepts `args`, or null (an unknown name, or arguments
  // no overload accepts).
  std::shared_ptr<const Overload> find(const std::string& name, const IValueList& args) const;
  // Runs the overload of `name` that accepts `args`; unknown names and arguments no overload
  // accepts throw InvalidArgumentError listing the candidates.
  Future<IValue> invoke(const std::string& name, const IValueList& args) const;

 private:
  void add_overload(const std::string& name, Overload o);
  std::string name_of_key(const std::string& key, const char* what) const;

  template <typename M>
  static std::string member_key(M m) {
    return std::string(reinterpret_cast<const char*>(&m), sizeof(m)) + typeid(M).name();
  }
  template <typename C, typename R, typename... A, typename M, typename Call>
  FunctionTable& add_method_impl(const std::string& method, M m, Call call) {
    const std::string full = class_name(typeid(C)) + "." + method;
    add(full,
        std::function<R(std::shared_ptr<C>, A...)>([call](std::shared_ptr<C> self, A... a) -> R {
          return call(*self, std::forward<A>(a)...);
        }));
    std::lock_guard lock(mu_);
    names_by_key_[member_key(m)] = full;
    return *this;
  }

  template <typename R, typename... A>
  static Overload make_overload(const std::string& name, std::function<R(A...)> fn, Runs runs) {
    Overload o;
    o.runs = runs;
    o.signature = name + "(";
    ((o.signature += IValueTraits<std::decay_t<A>>::name() + ", "), ...);
    if constexpr (sizeof...(A) > 0) o.signature.resize(o.signature.size() - 2);
    o.signature += ") -> " + IValueTraits<rpc_result_t<R>>::name();
    o.accepts = [](const IValueList& args) {
      return args.size() == sizeof...(A) &&
             accepts_all<A...>(args, std::index_sequence_for<A...>{});
    };
    o.invoke = [fn = std::move(fn)](const IValueList& args) -> Future<IValue> {
      auto call = [&]<size_t... I>(std::index_sequence<I...>)->R {
        return fn(IValueTraits<std::decay_t<A>>::from(args[I])...);
      };
      if constexpr (is_future_v<R>) {
        return call(std::index_sequence_for<A...>{}).then([](auto& done) -> IValue {
          if constexpr (std::is_void_v<rpc_result_t<R>>) {
            done.wait();
            return IValue();
          } else {
            return to_ivalue(done.wait());
          }
        });
      } else if constexpr (std::is_void_v<R>) {
        call(std::index_sequence_for<A...>{});
        return Future<IValue>::ready(IValue());
      } else {
        return Future<IValue>::ready(to_ivalue(call(std::index_sequence_for<A...>{})));
      }
    };
    return o;
  }

  template <typename... A, size_t... I>
  static bool accepts_all(const IValueList& args, std::index_sequence<I...>) {
    return (IValueTraits<std::decay_t<A>>::accepts(args[I]) && ...);
  }

  mutable std::mutex mu_;
  // Shared, so that a lookup hands an overload out without copying it.
  std::map<std::string, std::vector<std::shared_ptr<const Overload>>> table_;
  std::unordered_map<const void*, std::string> names_;
  std::unordered_map<std::string, std::string> names_by_key_;  // methods
  std::unordered_map<std::type_index, std::string> class_names_;
};

// The process's function table, with the builtin tensor ops registered.
FunctionTable& functions();

namespace detail {
struct Registrar {
  template <typename F>
  Registrar(const char* name, F fn, Runs runs = Runs::kOnPool) {
    functions().add(name, fn, runs);
  }
};
}  // namespace detail

}  // namespace gw::rpc

// Registers a free function under its own name at static-initialization time.
#define GW_RPC_FUNCTION(fn) \
  static const ::gw::rpc::detail::Registrar gw_rpc_registrar_##fn(#fn, &fn)
// The same, for a function that runs on the thread that read its request (Runs::kInline).
#define GW_RPC_INLINE_FUNCTION(fn)                                          \
  static const ::gw::rpc::detail::Registrar gw_rpc_registrar_##fn(#fn, &fn, \
                                                                  ::gw::rpc::Runs::kInline)
