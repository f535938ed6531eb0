#include "rpc/ivalue.h"

namespace gw::rpc {

const char* IValue::kind_name() const {
  switch (kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kDouble:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kTensor:
      return "Tensor";
    case Kind::kList:
      return "list";
    case Kind::kBytes:
      return "bytes";
    case Kind::kRRef:
    case Kind::kRRefFork:
      return "RRef";
    case Kind::kObject:
      return "object";
  }
  return "?";
}

void IValue::transform(const std::function<std::optional<IValue>(const IValue&)>& f) {
  if (auto r = f(*this)) {
    *this = std::move(*r);
  } else if (auto* l = std::get_if<IValueList>(&v_)) {
    for (auto& x : *l) x.transform(f);
  }
}

bool IValue::contains(Kind k) const {
  if (kind() == k) return true;
  if (const auto* l = std::get_if<IValueList>(&v_))
    for (const auto& x : *l)
      if (x.contains(k)) return true;
  return false;
}

void IValue::collect_tensors(std::vector<Tensor>& out) const {
  if (const auto* t = std::get_if<Tensor>(&v_)) {
    out.push_back(*t);
  } else if (const auto* l = std::get_if<IValueList>(&v_)) {
    for (const auto& x : *l) x.collect_tensors(out);
  }
}

IValue IValueTraits<Scalar>::to(const Scalar& s) {
  if (s.is_bool()) return IValue(s.to<bool>());
  if (s.is_integral()) return IValue(s.to<int64_t>());
  return IValue(s.to_double());
}

Scalar IValueTraits<Scalar>::from(const IValue& v) {
  switch (v.kind()) {
    case IValue::Kind::kBool:
      return Scalar(v.to_bool());
    case IValue::Kind::kInt:
      return Scalar(v.to_int());
    default:
      return Scalar(v.to_double());
  }
}

}  // namespace gw::rpc
