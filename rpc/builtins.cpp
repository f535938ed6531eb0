// The builtin functions every worker can run without registering anything: the public tensor
// ops of core under their PyTorch names (torch.add, torch.matmul, ...), overloaded where core
// is, and Python's min/max on numbers (the examples of pytorch.org/docs/stable/rpc.html use them).
#include <algorithm>

#include "core/ops.h"
#include "rpc/function_table.h"

namespace gw::rpc {

namespace {

using T = const Tensor&;
using S = const Scalar&;
using Tensors = const std::vector<Tensor>&;

void register_elementwise(FunctionTable& t) {
  // Every unary op of core/op_list.h that has a function of its own, under its name.
#define GW_UNARY_FN(Enum, name) t.add(#name, static_cast<Tensor (*)(T)>(gw::name));
  GW_FOR_EACH_UNARY_FN
#undef GW_UNARY_FN
  t.add("gelu", [](T x) { return gw::gelu(x); });
  t.add("gelu", [](T x, std::string approximate) { return gw::gelu(x, approximate); });
  t.add("clamp", [](T x, std::optional<Scalar> lo, std::optional<Scalar> hi) {
    return gw::clamp(x, lo, hi);
  });

  using Binary = Tensor (*)(T, T);
  using WithScalar = Tensor (*)(T, S);
  t.add("add", [](T a, T b) { return gw::add(a, b); });
  t.add("add", [](T a, S b) { return gw::add(a, b); });
  t.add("add", [](T a, T b, S alpha) { return gw::add(a, b, alpha); });
  t.add("sub", [](T a, T b) { return gw::sub(a, b); });
  t.add("sub", [](T a, S b) { return gw::sub(a, b); });
  t.add("sub", [](T a, T b, S alpha) { return gw::sub(a, b, alpha); });
  for (auto [name, tt, ts] :
       std::initializer_list<std::tuple<const char*, Binary, WithScalar>>{{"mul", gw::mul, gw::mul},
                                                                          {"div", gw::div, gw::div},
                                                                          {"pow", gw::pow, gw::pow},
                                                                          {"eq", gw::eq, gw::eq},
                                                                          {"ne", gw::ne, gw::ne},
                                                                          {"lt", gw::lt, gw::lt},
                                                                          {"le", gw::le, gw::le},
                                                                          {"gt", gw::gt, gw::gt},
                                                                          {"ge", gw::ge, gw::ge}}) {
    t.add(name, tt);
    t.add(name, ts);
  }
  for (auto [name, fn] :
       std::initializer_list<std::pair<const char*, Binary>>{{"maximum", gw::maximum},
                                                             {"minimum", gw::minimum},
                                                             {"logical_and", gw::logical_and},
                                                             {"logical_or", gw::logical_or}})
    t.add(name, fn);
  t.add("where", [](T cond, T a, T b) { return gw::where(cond, a, b); });
  t.add("masked_fill", [](T x, T mask, S v) { return gw::masked_fill(x, mask, v); });
}

void register_reductions_and_linalg(FunctionTable& t) {
  t.add("sum", [](T x) { return gw::sum(x); });
  t.add("sum", [](T x, Shape dims, bool keepdim) { return gw::sum(x, dims, keepdim); });
  t.add("mean", [](T x) { return gw::mean(x); });
  t.add("mean", [](T x, Shape dims, bool keepdim) { return gw::mean(x, dims, keepdim); });
  t.add("prod", [](T x) { return gw::prod(x); });
  t.add("max", [](T x) { return gw::max(x); });
  t.add("min", [](T x) { return gw::min(x); });
  t.add("amax", [](T x, Shape dims, bool keepdim) { return gw::amax(x, dims, keepdim); });
  t.add("amin", [](T x, Shape dims, bool keepdim) { return gw::amin(x, dims, keepdim); });
  t.add("argmax", [](T x) { return gw::argmax(x); });
  t.add("argmax", [](T x, int64_t dim, bool keepdim) { return gw::argmax(x, dim, keepdim); });
  t.add("argmin", [](T x) { return gw::argmin(x); });
  t.add("argmin", [](T x, int64_t dim, bool keepdim) { return gw::argmin(x, dim, keepdim); });
  t.add("var", [](T x, Shape dims, int64_t correction, bool keepdim) {
    return gw::var(x, dims, correction, keepdim);
  });
  t.add("std", [](T x, Shape dims, int64_t correction, bool keepdim) {
    return gw::std(x, dims, correction, keepdim);
  });
  t.add("logsumexp", [](T x, Shape dims, bool keepdim) { return gw::logsumexp(x, dims, keepdim); });
  t.add("softmax", [](T x, int64_t dim) { return gw::softmax(x, dim); });
  t.add("log_softmax", [](T x, int64_t dim) { return gw::log_softmax(x, dim); });
  t.add("matmul", [](T a, T b) { return gw::matmul(a, b); });
  t.add("mm", [](T a, T b) { return gw::mm(a, b); });
  t.add("bmm", [](T a, T b) { return gw::bmm(a, b); });
  t.add("dot", [](T a, T b) { return gw::dot(a, b); });
  t.add("linear", [](T x, T w) { return gw::linear(x, w); });
  t.add("linear", [](T x, T w, T b) { return gw::linear(x, w, b); });
}

void register_shape_and_index(FunctionTable& t) {
  t.add("clone", [](T x) { return x.clone(); });
  t.add("contiguous", [](T x) { return x.contiguous(); });
  t.add("t", [](T x) { return x.t(); });
  t.add("reshape", [](T x, Shape s) { return gw::reshape(x, s); });
  t.add("transpose", [](T x, int64_t a, int64_t b) { return gw::transpose(x, a, b); });
  t.add("permute", [](T x, Shape dims) { return gw::permute(x, dims); });
  t.add("flatten", [](T x) { return gw::flatten(x); });
  t.add("flatten", [](T x, int64_t start, int64_t end) { return gw::flatten(x, start, end); });
  t.add("squeeze", [](T x) { return gw::squeeze(x); });
  t.add("squeeze", [](T x, int64_t dim) { return gw::squeeze(x, dim); });
  t.add("unsqueeze", [](T x, int64_t dim) { return gw::unsqueeze(x, dim); });
  t.add("expand", [](T x, Shape s) { return gw::expand(x, s); });
  t.add("narrow", [](T x, int64_t d, int64_t s, int64_t n) { return gw::narrow(x, d, s, n); });
  t.add("select", [](T x, int64_t d, int64_t i) { return gw::select(x, d, i); });
  t.add("cat", [](Tensors xs, int64_t dim) { return gw::cat(xs, dim); });
  t.add("cat", [](Tensors xs) { return gw::cat(xs); });
  t.add("stack", [](Tensors xs, int64_t dim) { return gw::stack(xs, dim); });
  t.add("stack", [](Tensors xs) { return gw::stack(xs); });
  t.add("split", [](T x, int64_t size, int64_t dim) { return gw::split(x, size, dim); });
  t.add("chunk", [](T x, int64_t n, int64_t dim) { return gw::chunk(x, n, dim); });
  t.add("index_select", [](T x, int64_t d, T i) { return gw::index_select(x, d, i); });
  t.add("gather", [](T x, int64_t d, T i) { return gw::gather(x, d, i); });
  t.add("scatter_add", [](T x, int64_t d, T i, T src) { return gw::scatter_add(x, d, i, src); });
  t.add("embedding", [](T w, T i) { return gw::embedding(w, i); });
  t.add("one_hot", [](T i, int64_t n) { return gw::one_hot(i, n); });
}

void register_creation(FunctionTable& t) {
  t.add("ones", [](Shape s) { return gw::ones(s); });
  t.add("zeros", [](Shape s) { return gw::zeros(s); });
  t.add("full", [](Shape s, S v) { return gw::full(s, v); });
  t.add("eye", [](int64_t n) { return gw::eye(n); });
  t.add("arange", [](S end) { return gw::arange(end); });
  t.add("arange", [](S start, S end) { return gw::arange(start, end); });
  t.add("linspace", [](double a, double b, int64_t n) { return gw::linspace(a, b, n); });
  t.add("ones_like", [](T x) { return gw::ones_like(x); });
  t.add("zeros_like", [](T x) { return gw::zeros_like(x); });
}

void register_builtins(FunctionTable& t) {
  register_elementwise(t);
  register_reductions_and_linalg(t);
  register_shape_and_index(t);
  register_creation(t);
  // Python's min/max on numbers, run where they are read: for ints and for floats. Registered
  // after the tensor overloads, which take a Tensor.
  auto on_numbers = [&t](const char* name, auto pick) {
    t.add(name, std::function<int64_t(int64_t, int64_t)>(pick), Runs::kInline);
    t.add(name, std::function<double(double, double)>(pick), Runs::kInline);
  };
  on_numbers("min", [](auto a, auto b) { return std::min(a, b); });
  on_numbers("max", [](auto a, auto b) { return std::max(a, b); });
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
