// How the Gloo group runs each collective's body on the group's thread (or the waiter's), once
// the queue (collective_queue.h) has given it its tag: through the group's shared memory when
// every rank is on this host (shm_collectives.h), else on Gloo's pairs. ProcessGroupGloo queues
// these; they are apart from it so that the group reads as the queue, liveness and
// point-to-point machinery it is.
//
//   Transport via{context, shm};
//   allreduce_now("allreduce", via, t, ReduceOp::SUM, tag, timeout);
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/types.h>

#include "core/tensor.h"
#include "dist/process_group/shm_collectives.h"
#include "dist/process_group/types.h"

namespace gw::dist::detail {

// The element types Gloo reduces (besides the 16-bit ones dispatch_reduce adds).
using ReduceTypes = TypeList<float, double, int64_t, int32_t>;

// Calls f.template operator()<T>() with the element type Gloo reduces for `dtype`: ours,
// Gloo's own float16 for float16 tensors, or our bfloat16 (16-bit types are summed only: DDP's
// fp16 and bf16 compression).
template <typename F>
void dispatch_reduce(DType dtype, ReduceOp op, const char* name, F&& f) {
  if (dtype == DType::Float16 || dtype == DType::BFloat16) {
    GW_CHECK(op == ReduceOp::SUM, InvalidArgumentError, "[", name, "] ", dtype_name(dtype),
             " tensors are reduced with SUM only, got ", to_string(op));
    if (dtype == DType::Float16)
      f.template operator()<gloo::float16>();
    else
      f.template operator()<BFloat16>();
  } else {
    dispatch<ReduceTypes>(dtype, name, std::forward<F>(f));
  }
}

// Gloo has no bfloat16: its sum, through float32, rounded to nearest even.
void bfloat16_sum(void* c, const void* a, const void* b, size_t n);

template <typename T>
ReduceFunction reduce_function(ReduceOp op) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return &bfloat16_sum;  // SUM only (dispatch_reduce)
  } else {
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG:
        return static_cast<ReduceFunction>(&gloo::sum<T>);
      case ReduceOp::PRODUCT:
        return static_cast<ReduceFunction>(&gloo::product<T>);
      case ReduceOp::MIN:
        return static_cast<ReduceFunction>(&gloo::min<T>);
      case ReduceOp::MAX:
        return static_cast<ReduceFunction>(&gloo::max<T>);
    }
  }
  throw InvalidArgumentError("[process_group] unknown reduce op");
}

inline uint8_t* bytes_of(const Tensor& t) { return static_cast<uint8_t*>(t.raw_data()); }

// How a group's allreduce moves its bytes: Gloo's pairs, or, with every rank on this host, the
// group's shared memory (null otherwise).
struct Transport {
  std::shared_ptr<gloo::Context> context;
  std::shared_ptr<ShmCollectives> shm;
};

// The collectives' bodies; `name` names the collective in errors. Each divides for AVG.
void allreduce_now(const char* name, const Transport& via, const Tensor& t, ReduceOp op,
                   uint32_t tag, Milliseconds timeout);
// The tensors (contiguous, of one dtype) reduced where they are, as if laid end to end: through
// shared memory only (`via.shm`), which needs no flat copy of them.
void allreduce_in_place_now(const char* name, const Transport& via, std::span<const Tensor> tensors,
                            ReduceOp op, uint32_t tag, Milliseconds timeout);
// `input` into `output` (size() chunks like it).
void allgather_now(const char* name, const Transport& via, const Tensor& input,
                   const Tensor& output, uint32_t tag, Milliseconds timeout);
// `input` (size() chunks) into `output` (this rank's chunk, reduced).
void reduce_scatter_now(const char* name, const Transport& via, const Tensor& input,
                        const Tensor& output, ReduceOp op, uint32_t tag, Milliseconds timeout);
void broadcast_now(const Transport& via, const Tensor& t, int root, uint32_t tag,
                   Milliseconds timeout);
void barrier_now(const Transport& via, uint32_t tag, Milliseconds timeout);

}  // namespace gw::dist::detail
