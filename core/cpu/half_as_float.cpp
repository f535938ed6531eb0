#include "core/cpu/half_as_float.h"

#include "core/cpu/cpu_backend.h"
#include "core/ops/creation.h"

namespace gw::cpu::halves {

namespace {
bool is_half(const Tensor& t) {
  return t.defined() && (t.dtype() == kBFloat16 || t.dtype() == kFloat16);
}
}  // namespace

std::vector<Tensor> widen(std::initializer_list<const Tensor*> reads,
                          std::initializer_list<const Tensor*> writes) {
  std::vector<Tensor> out;
  out.reserve(reads.size() + writes.size());
  for (auto list : {reads, writes}) {
    for (const Tensor* t : list) {
      if (!is_half(*t)) {
        out.push_back(*t);
        continue;
      }
      Tensor w = empty(t->sizes(), TensorOptions(kFloat32));
      cpu_backend().copy(*t, w);
      out.push_back(std::move(w));
    }
  }
  return out;
}

void narrow(const std::vector<Tensor>& widened, std::initializer_list<const Tensor*> reads,
            std::initializer_list<const Tensor*> writes) {
  size_t i = reads.size();
  for (const Tensor* t : writes) {
    if (is_half(*t)) cpu_backend().copy(widened[i], *t);
    ++i;
  }
}

}  // namespace gw::cpu::halves
