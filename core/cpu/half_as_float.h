// float16 and bfloat16 arithmetic on the CPU. The CPU kernels compute in float32 and float64
// only, so an op with a 16-bit floating operand runs on float32 copies of its operands and what
// it wrote is rounded back once, as a GPU kernel computes those types in float and rounds on
// store. One guard line opens each CpuBackend method that computes:
//
//   void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
//     if (in_float32({&a, &b}, {&out}, [&](const auto& t) { binary(op, t[0], t[1], t[2]); }))
//       return;
//     ...                                            // float32, float64, integers, bool
//
// `t` holds the operands in the order given, reads then writes. A read is converted where it
// holds distinct values only (a broadcast operand, such as an attention mask expanded over heads,
// stays a broadcast of its float32 copy); a write starts empty and is rounded into the operand
// after, unless the kernel adds to it (Written::accumulated: copied in first). Operands of other
// dtypes (indices, masks, float32 statistics) and undefined ones are passed as they are. Each
// 16-bit operand costs a conversion each way: on the CPU these types are for storage and for
// running a mixed-precision program (autocast, FSDP's param_dtype) where a GPU would, not for
// speed.
#pragma once

#include <initializer_list>
#include <vector>

#include "core/tensor.h"

namespace gw::cpu {

enum class Written { overwritten, accumulated };

namespace halves {
inline bool is_half(const Tensor& t) { return t.defined() && is_16_bit_float(t.dtype()); }
inline bool any_half(std::initializer_list<const Tensor*> reads,
                     std::initializer_list<const Tensor*> writes) {
  for (auto list : {reads, writes}) {
    for (const Tensor* t : list) {
      if (is_half(*t)) return true;
    }
  }
  return false;
}
std::vector<Tensor> widen(std::initializer_list<const Tensor*> reads,
                          std::initializer_list<const Tensor*> writes, Written written);
void narrow(const std::vector<Tensor>& widened, std::initializer_list<const Tensor*> reads,
            std::initializer_list<const Tensor*> writes);
}  // namespace halves

// Runs `run(operands)` in float32 and returns true when any operand is float16 or bfloat16;
// returns false, running nothing, otherwise.
template <typename Run>
bool in_float32(std::initializer_list<const Tensor*> reads,
                std::initializer_list<const Tensor*> writes, Run&& run,
                Written written = Written::overwritten) {
  if (!halves::any_half(reads, writes)) [[likely]]
    return false;
  const std::vector<Tensor> widened = halves::widen(reads, writes, written);
  run(widened);
  halves::narrow(widened, reads, writes);
  return true;
}

}  // namespace gw::cpu
