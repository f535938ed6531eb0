#include "rpc/function_table.h"

#include <cxxabi.h>

#include <cstdlib>

namespace gw::rpc {

namespace {
std::string describe_args(const IValueList& args) {
  std::string s = "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + std::string(args[i].kind_name());
  return s + ")";
}
}  // namespace

void FunctionTable::add_overload(const std::string& name, Overload o) {
  std::lock_guard lock(mu_);
  table_[name].push_back(std::make_shared<const Overload>(std::move(o)));
}

std::string FunctionTable::name_of(const void* fn) const {
  std::lock_guard lock(mu_);
  auto it = names_.find(fn);
  GW_CHECK(it != names_.end(), InvalidArgumentError,
           "[rpc] this function is not registered for RPC: register it with GW_RPC_FUNCTION or "
           "gw::rpc::functions().add(name, fn) on every worker");
  return it->second;
}

std::string FunctionTable::name_of_key(const std::string& key, const char* what) const {
  std::lock_guard lock(mu_);
  auto it = names_by_key_.find(key);
  GW_CHECK(it != names_by_key_.end(), InvalidArgumentError, "[rpc] this ", what,
           " is not registered for RPC: register it with gw::rpc::functions().add_method");
  return it->second;
}

std::string FunctionTable::class_name(const std::type_info& type) const {
  std::lock_guard lock(mu_);
  auto it = class_names_.find(std::type_index(type));
  if (it != class_names_.end()) return it->second;
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : type.name();
  std::free(demangled);
  return name;
}

std::string class_name_of(const std::type_info& type) { return functions().class_name(type); }

bool FunctionTable::contains(const std::string& name) const {
  std::lock_guard lock(mu_);
  return table_.contains(name);
}

std::shared_ptr<const FunctionTable::Overload> FunctionTable::find(const std::string& name,
                                                                   const IValueList& args) const {
  std::lock_guard lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return nullptr;
  for (const auto& o : it->second)
    if (o->accepts(args)) return o;
  return nullptr;
}

Future<IValue> FunctionTable::invoke(const std::string& name, const IValueList& args) const {
  if (auto o = find(name, args)) return o->invoke(args);
  std::string candidates;
  {
    std::lock_guard lock(mu_);
    auto it = table_.find(name);
    GW_CHECK(it != table_.end(), InvalidArgumentError, "[rpc] unknown function '", name,
             "': it is not registered on this worker");
    for (const auto& o : it->second) candidates += "\n  " + o->signature;
  }
  throw InvalidArgumentError(gw::detail::str("[rpc] no overload of '", name, "' accepts arguments ",
                                             describe_args(args), "; candidates:", candidates));
}

}  // namespace gw::rpc
