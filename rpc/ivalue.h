// gw::rpc::IValue — a dynamically typed value: what RPC arguments and results are on the wire.
//
// Mental model (PyTorch's IValue): the function table is typed (`Tensor my_add(Tensor, Tensor)`)
// but messages are not, so every argument is turned into an IValue on the caller and back into
// the parameter's C++ type on the callee. `IValueTraits<T>` does both directions and says whether
// an IValue fits T, which is how a call with the wrong arguments is rejected with a clear error.
// Supported: Tensor, bool, integers, floating point, Scalar, std::string, std::vector, std::pair,
// std::tuple, std::map (e.g. a state_dict), std::optional, IValue itself, and user types that
// specialize gw::rpc::Serializer:
//
//   struct Point { double x, y; };
//   template <> struct gw::rpc::Serializer<Point> {
//     static std::vector<uint8_t> serialize(const Point& p);
//     static Point deserialize(std::span<const uint8_t> bytes);
//   };
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/scalar.h"
#include "core/tensor.h"
#include "rpc/rref_id.h"

namespace gw::rpc {

class IValue;
using IValueList = std::vector<IValue>;
using Bytes = std::vector<uint8_t>;

class IValue {
 public:
  // kRRef: a reference held on this worker; kRRefFork: that reference as sent to another
  // worker (the agent converts between them); kObject: a C++ object that stays on this worker.
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kDouble,
    kString,
    kTensor,
    kList,
    kBytes,
    kRRef,
    kRRefFork,
    kObject
  };
  using Storage =
      std::variant<std::monostate, bool, int64_t, double, std::string, Tensor, IValueList, Bytes,
                   std::shared_ptr<RRefHandle>, RRefForkData, Object>;

  IValue() = default;
  IValue(bool v) : v_(v) {}                    // NOLINT: implicit like PyTorch's IValue
  IValue(int64_t v) : v_(v) {}                 // NOLINT
  IValue(double v) : v_(v) {}                  // NOLINT
  IValue(std::string v) : v_(std::move(v)) {}  // NOLINT
  IValue(Tensor v) : v_(std::move(v)) {}       // NOLINT
  IValue(IValueList v) : v_(std::move(v)) {}   // NOLINT
  static IValue bytes(Bytes b) { return IValue(Storage(std::move(b))); }
  static IValue rref(std::shared_ptr<RRefHandle> h) { return IValue(Storage(std::move(h))); }
  static IValue rref_fork(RRefForkData d) { return IValue(Storage(std::move(d))); }
  static IValue object(Object o) { return IValue(Storage(std::move(o))); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  const char* kind_name() const;
  bool is(Kind k) const { return kind() == k; }

  bool to_bool() const { return get<bool>("bool"); }
  int64_t to_int() const { return get<int64_t>("int"); }
  double to_double() const { return get<double>("float"); }
  const std::string& to_string() const { return get<std::string>("string"); }
  const Tensor& to_tensor() const { return get<Tensor>("Tensor"); }
  const IValueList& to_list() const { return get<IValueList>("list"); }
  IValueList& to_list() { return const_cast<IValueList&>(std::as_const(*this).to_list()); }
  const Bytes& to_bytes() const { return get<Bytes>("bytes"); }
  const std::shared_ptr<RRefHandle>& to_rref() const {
    return get<std::shared_ptr<RRefHandle>>("RRef");
  }
  const RRefForkData& to_rref_fork() const { return get<RRefForkData>("RRef"); }
  const Object& to_object() const { return get<Object>("object"); }

  // Replaces, depth first, every value for which `f` returns a replacement (the agent uses it
  // to turn RRefs into forks when sending, and forks into RRefs when receiving).
  void transform(const std::function<std::optional<IValue>(const IValue&)>& f);
  bool contains(Kind k) const;
  // Appends the tensors inside, depth first: the order they take on the wire.
  void collect_tensors(std::vector<Tensor>& out) const;

 private:
  explicit IValue(Storage s) : v_(std::move(s)) {}
  template <typename V>
  const V& get(const char* want) const {
    const V* p = std::get_if<V>(&v_);
    GW_CHECK(p, InvalidArgumentError, "[IValue] expected ", want, ", got ", kind_name());
    return *p;
  }
  Storage v_;
};

// Specialize for user types to send them through RPC as opaque bytes.
template <typename T>
struct Serializer;

template <typename T>
concept UserSerializable = requires(const T& v, std::span<const uint8_t> b) {
  { Serializer<T>::serialize(v) } -> std::convertible_to<Bytes>;
  { Serializer<T>::deserialize(b) } -> std::convertible_to<T>;
};

// to(v): the IValue of v. accepts(iv): whether from(iv) would succeed. name(): for messages.
template <typename T, typename Enable = void>
struct IValueTraits;

template <>
struct IValueTraits<IValue> {
  static IValue to(IValue v) { return v; }
  static bool accepts(const IValue&) { return true; }
  static IValue from(const IValue& v) { return v; }
  static std::string name() { return "IValue"; }
};

template <>
struct IValueTraits<void> {  // a function returning nothing answers None
  static std::string name() { return "None"; }
};

template <>
struct IValueTraits<Tensor> {
  static IValue to(const Tensor& t) { return IValue(t); }
  static bool accepts(const IValue& v) { return v.is(IValue::Kind::kTensor); }
  static Tensor from(const IValue& v) { return v.to_tensor(); }
  static std::string name() { return "Tensor"; }
};

template <>
struct IValueTraits<bool> {
  static IValue to(bool b) { return IValue(b); }
  static bool accepts(const IValue& v) { return v.is(IValue::Kind::kBool); }
  static bool from(const IValue& v) { return v.to_bool(); }
  static std::string name() { return "bool"; }
};

template <std::integral T>
struct IValueTraits<T, std::enable_if_t<!std::is_same_v<T, bool>>> {
  static IValue to(T x) { return IValue(static_cast<int64_t>(x)); }
  static bool accepts(const IValue& v) { return v.is(IValue::Kind::kInt); }
  static T from(const IValue& v) { return static_cast<T>(v.to_int()); }
  static std::string name() { return "int"; }
};

template <std::floating_point T>
struct IValueTraits<T> {
  static IValue to(T x) { return IValue(static_cast<double>(x)); }
  // An int argument is fine where a float is expected, as in Python.
  static bool accepts(const IValue& v) {
    return v.is(IValue::Kind::kDouble) || v.is(IValue::Kind::kInt);
  }
  static T from(const IValue& v) {
    return static_cast<T>(v.is(IValue::Kind::kInt) ? static_cast<double>(v.to_int())
                                                   : v.to_double());
  }
  static std::string name() { return "float"; }
};

template <>
struct IValueTraits<Scalar> {
  static IValue to(const Scalar& s);
  static bool accepts(const IValue& v) {
    return v.is(IValue::Kind::kInt) || v.is(IValue::Kind::kDouble) || v.is(IValue::Kind::kBool);
  }
  static Scalar from(const IValue& v);
  static std::string name() { return "Scalar"; }
};

template <>
struct IValueTraits<std::string> {
  static IValue to(const std::string& s) { return IValue(s); }
  static bool accepts(const IValue& v) { return v.is(IValue::Kind::kString); }
  static std::string from(const IValue& v) { return v.to_string(); }
  static std::string name() { return "str"; }
};

template <typename T>
struct IValueTraits<std::vector<T>> {
  static IValue to(const std::vector<T>& xs) {
    IValueList l;
    l.reserve(xs.size());
    for (const auto& x : xs) l.push_back(IValueTraits<T>::to(x));
    return IValue(std::move(l));
  }
  static bool accepts(const IValue& v) {
    if (!v.is(IValue::Kind::kList)) return false;
    for (const auto& x : v.to_list())
      if (!IValueTraits<T>::accepts(x)) return false;
    return true;
  }
  static std::vector<T> from(const IValue& v) {
    std::vector<T> out;
    for (const auto& x : v.to_list()) out.push_back(IValueTraits<T>::from(x));
    return out;
  }
  static std::string name() { return "List[" + IValueTraits<T>::name() + "]"; }
};

// Shapes travel as lists of ints.
template <>
struct IValueTraits<Shape> {
  static IValue to(const Shape& s) {
    return IValueTraits<std::vector<int64_t>>::to(std::vector<int64_t>(s.begin(), s.end()));
  }
  static bool accepts(const IValue& v) { return IValueTraits<std::vector<int64_t>>::accepts(v); }
  static Shape from(const IValue& v) {
    auto d = IValueTraits<std::vector<int64_t>>::from(v);
    return Shape(d.begin(), d.end());
  }
  static std::string name() { return "List[int]"; }
};

template <typename... Ts>
struct IValueTraits<std::tuple<Ts...>> {
  static IValue to(const std::tuple<Ts...>& t) {
    return std::apply(
        [](const auto&... x) {
          return IValue(IValueList{IValueTraits<std::decay_t<decltype(x)>>::to(x)...});
        },
        t);
  }
  static bool accepts(const IValue& v) {
    if (!v.is(IValue::Kind::kList) || v.to_list().size() != sizeof...(Ts)) return false;
    return accepts_each(v.to_list(), std::index_sequence_for<Ts...>{});
  }
  static std::tuple<Ts...> from(const IValue& v) {
    GW_CHECK(accepts(v), InvalidArgumentError, "[IValue] expected ", name(), ", got ",
             v.kind_name());
    return from_each(v.to_list(), std::index_sequence_for<Ts...>{});
  }
  static std::string name() {
    std::string n = "Tuple[";
    ((n += IValueTraits<Ts>::name() + ","), ...);
    if (sizeof...(Ts)) n.pop_back();
    return n + "]";
  }

 private:
  template <size_t... I>
  static bool accepts_each(const IValueList& l, std::index_sequence<I...>) {
    return (IValueTraits<Ts>::accepts(l[I]) && ...);
  }
  template <size_t... I>
  static std::tuple<Ts...> from_each(const IValueList& l, std::index_sequence<I...>) {
    return std::tuple<Ts...>(IValueTraits<Ts>::from(l[I])...);
  }
};

template <typename A, typename B>
struct IValueTraits<std::pair<A, B>> {
  using Tuple = IValueTraits<std::tuple<A, B>>;
  static IValue to(const std::pair<A, B>& p) { return Tuple::to(std::tuple<A, B>(p)); }
  static bool accepts(const IValue& v) { return Tuple::accepts(v); }
  static std::pair<A, B> from(const IValue& v) {
    auto [a, b] = Tuple::from(v);
    return {std::move(a), std::move(b)};
  }
  static std::string name() { return Tuple::name(); }
};

// Maps travel as lists of (key, value) pairs, in key order.
template <typename K, typename V>
struct IValueTraits<std::map<K, V>> {
  using Pairs = IValueTraits<std::vector<std::pair<K, V>>>;
  static IValue to(const std::map<K, V>& m) {
    return Pairs::to(std::vector<std::pair<K, V>>(m.begin(), m.end()));
  }
  static bool accepts(const IValue& v) { return Pairs::accepts(v); }
  static std::map<K, V> from(const IValue& v) {
    std::map<K, V> out;
    for (auto& [k, x] : Pairs::from(v)) out.insert_or_assign(std::move(k), std::move(x));
    return out;
  }
  static std::string name() {
    return "Dict[" + IValueTraits<K>::name() + "," + IValueTraits<V>::name() + "]";
  }
};

template <typename T>
struct IValueTraits<std::optional<T>> {
  static IValue to(const std::optional<T>& o) { return o ? IValueTraits<T>::to(*o) : IValue(); }
  static bool accepts(const IValue& v) {
    return v.is(IValue::Kind::kNone) || IValueTraits<T>::accepts(v);
  }
  static std::optional<T> from(const IValue& v) {
    if (v.is(IValue::Kind::kNone)) return std::nullopt;
    return IValueTraits<T>::from(v);
  }
  static std::string name() { return "Optional[" + IValueTraits<T>::name() + "]"; }
};

template <UserSerializable T>
struct IValueTraits<T> {
  static IValue to(const T& x) { return IValue::bytes(Serializer<T>::serialize(x)); }
  static bool accepts(const IValue& v) { return v.is(IValue::Kind::kBytes); }
  static T from(const IValue& v) { return Serializer<T>::deserialize(v.to_bytes()); }
  static std::string name() { return "bytes"; }
};

// The name a class was registered under (FunctionTable::add_class), else its C++ type name.
std::string class_name_of(const std::type_info& type);
// The object `v` holds, or that the owner's RRef `v` refers to (waiting for the value to be
// created, as PyTorch's local_value does); nullopt for anything else.
std::optional<Object> local_object(const IValue& v);

// Objects of registered classes: they stay on the worker that made them (an RRef's owner).
template <typename C>
requires std::is_class_v<C>
struct IValueTraits<std::shared_ptr<C>> {
  static IValue to(const std::shared_ptr<C>& p) {
    return IValue::object(Object{p, &typeid(C), class_name_of(typeid(C))});
  }
  static bool accepts(const IValue& v) {
    return (v.is(IValue::Kind::kObject) && *v.to_object().type == typeid(C)) ||
           v.is(IValue::Kind::kRRef);  // checked by from(), once the value exists
  }
  static std::shared_ptr<C> from(const IValue& v) {
    std::optional<Object> o = local_object(v);
    GW_CHECK(o && *o->type == typeid(C), InvalidArgumentError, "[rpc] expected an object of type ",
             name(), " on this worker, got ", o ? o->type_name : std::string(v.kind_name()));
    return std::static_pointer_cast<C>(o->ptr);
  }
  static std::string name() { return class_name_of(typeid(C)); }
};

// String literals become std::string arguments.
template <size_t N>
struct IValueTraits<char[N]> : IValueTraits<std::string> {};
template <>
struct IValueTraits<const char*> : IValueTraits<std::string> {};

template <typename T>
IValue to_ivalue(const T& x) {
  return IValueTraits<std::decay_t<T>>::to(x);
}

}  // namespace gw::rpc
