// The builtin functions every worker can run without registering anything: the public tensor
// ops under their PyTorch names, and Python's min/max on numbers (the RPC spec's examples use
// them).
#include <algorithm>

#include "core/ops.h"
#include "rpc/function_table.h"

namespace gw::rpc {

namespace {

Shape to_shape(const std::vector<int64_t>& v) { return Shape(v.begin(), v.end()); }

void register_builtins(FunctionTable& t) {
  using T = const Tensor&;
  using S = const Scalar&;
  // Binary ops: Tensor op Tensor and Tensor op Scalar.
  t.add("add", [](T a, T b) { return gw::add(a, b); });
  t.add("add", [](T a, S b) { return gw::add(a, b); });
  t.add("sub", [](T a, T b) { return gw::sub(a, b); });
  t.add("sub", [](T a, S b) { return gw::sub(a, b); });
  t.add("mul", [](T a, T b) { return gw::mul(a, b); });
  t.add("mul", [](T a, S b) { return gw::mul(a, b); });
  t.add("div", [](T a, T b) { return gw::div(a, b); });
  t.add("div", [](T a, S b) { return gw::div(a, b); });
  t.add("pow", [](T a, T b) { return gw::pow(a, b); });
  t.add("pow", [](T a, S b) { return gw::pow(a, b); });
  t.add("maximum", [](T a, T b) { return gw::maximum(a, b); });
  t.add("minimum", [](T a, T b) { return gw::minimum(a, b); });
  t.add("eq", [](T a, T b) { return gw::eq(a, b); });
  t.add("matmul", [](T a, T b) { return gw::matmul(a, b); });
  t.add("mm", [](T a, T b) { return gw::mm(a, b); });
  t.add("bmm", [](T a, T b) { return gw::bmm(a, b); });
  t.add("dot", [](T a, T b) { return gw::dot(a, b); });
  // Unary ops.
  for (auto [name, fn] : std::initializer_list<std::pair<const char*, Tensor (*)(T)>>{
           {"neg", gw::neg},
           {"abs", gw::abs},
           {"exp", gw::exp},
           {"log", gw::log},
           {"sqrt", gw::sqrt},
           {"rsqrt", gw::rsqrt},
           {"relu", gw::relu},
           {"sigmoid", gw::sigmoid},
           {"tanh", gw::tanh},
           {"square", gw::square},
           {"sum", gw::sum},
           {"mean", gw::mean},
           {"clone", [](T x) { return x.clone(); }},
           {"t", [](T x) { return x.t(); }}})
    t.add(name, fn);
  t.add("sum", [](T x, std::vector<int64_t> dims, bool keepdim) {
    return gw::sum(x, to_shape(dims), keepdim);
  });
  t.add("softmax", [](T x, int64_t dim) { return gw::softmax(x, dim); });
  t.add("reshape", [](T x, std::vector<int64_t> shape) { return x.reshape(to_shape(shape)); });
  // Creation.
  t.add("ones", [](std::vector<int64_t> shape) { return gw::ones(to_shape(shape)); });
  t.add("zeros", [](std::vector<int64_t> shape) { return gw::zeros(to_shape(shape)); });
  t.add("full", [](std::vector<int64_t> shape, S v) { return gw::full(to_shape(shape), v); });
  // Python's min/max on numbers.
  t.add("min", [](int64_t a, int64_t b) { return std::min(a, b); });
  t.add("min", [](double a, double b) { return std::min(a, b); });
  t.add("max", [](int64_t a, int64_t b) { return std::max(a, b); });
  t.add("max", [](double a, double b) { return std::max(a, b); });
}

}  // namespace

FunctionTable& functions() {
  static FunctionTable* table = [] {
    auto* t = new FunctionTable;  // never destroyed: static registrars may outlive main
    register_builtins(*t);
    return t;
  }();
  return *table;
}

}  // namespace gw::rpc
