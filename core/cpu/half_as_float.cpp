#include "core/cpu/half_as_float.h"

#include "core/cpu/cpu_backend.h"
#include "core/ops/creation.h"
#include "core/ops/shape_ops.h"

namespace gw::cpu::halves {

namespace {

Tensor float32_copy(const Tensor& t) {
  Tensor w = empty(t.sizes(), TensorOptions(kFloat32));
  cpu_backend().copy(t, w);
  return w;
}

// A read operand in float32: its distinct values converted (one of each along a broadcast dim),
// then broadcast as the operand was.
Tensor widen_read(const Tensor& t) {
  const Tensor distinct = unexpanded(t);
  Tensor w = float32_copy(distinct);
  return distinct.sizes() == t.sizes() ? w : w.expand(t.sizes());
}

}  // namespace

std::vector<Tensor> widen(std::initializer_list<const Tensor*> reads,
                          std::initializer_list<const Tensor*> writes, Written written) {
  std::vector<Tensor> out;
  out.reserve(reads.size() + writes.size());
  for (const Tensor* t : reads) out.push_back(is_half(*t) ? widen_read(*t) : *t);
  for (const Tensor* t : writes) {
    if (!is_half(*t))
      out.push_back(*t);
    else if (written == Written::accumulated)
      out.push_back(float32_copy(*t));
    else
      out.push_back(empty(t->sizes(), TensorOptions(kFloat32)));
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
