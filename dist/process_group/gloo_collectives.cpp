#include "dist/process_group/gloo_collectives.h"

#include <cstring>
#include <optional>
#include <string>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/transport/unbound_buffer.h>

#include "core/ops.h"
#include "core/small_vector.h"
#include "dist/process_group/process_group.h"

namespace gw::dist::detail {

// Gloo has no bfloat16: its sum, through float32, rounded to nearest even.
void bfloat16_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<BFloat16*>(c);
  const auto* x = static_cast<const BFloat16*>(a);
  const auto* y = static_cast<const BFloat16*>(b);
  for (size_t i = 0; i < n; ++i)
    out[i] = float_to_bfloat16(bfloat16_to_float(x[i]) + bfloat16_to_float(y[i]));
}

namespace {

// The shared-memory collectives, as ranks must agree on them.
enum class ShmKind : uint64_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5
};

// What ranks must agree on about a collective through shared memory: which one it is, its tag
// (the same on every rank, by call order), the dtype and the op of a reduction (the others move
// bytes), a broadcast's root, and the element count.
ShmCollectives::Call shm_call(const char* op, ShmKind which, uint32_t tag,
                              std::optional<DType> dtype, std::optional<ReduceOp> reduce_op,
                              int64_t count, Milliseconds timeout, int root = 0) {
  // Bits: the tag 32-63, which 24-31, a broadcast's root or a reduction's dtype (+1) 8-23, the
  // op (+1) 0-7.
  const uint64_t middle = which == ShmKind::kBroadcast ? static_cast<uint64_t>(root) & 0xffff
                          : dtype                      ? static_cast<uint64_t>(*dtype) + 1
                                                       : 0;
  const uint64_t kind = uint64_t{tag} << 32 | static_cast<uint64_t>(which) << 24 | middle << 8 |
                        (reduce_op ? static_cast<uint64_t>(*reduce_op) + 1 : 0);
  auto describe = [](uint64_t k) {
    const uint64_t kind_of = (k >> 24) & 0xff, middle = (k >> 8) & 0xffff, o = k & 0xff;
    std::string what;
    if (kind_of == static_cast<uint64_t>(ShmKind::kBroadcast))
      what = "bytes from root " + std::to_string(middle);
    else
      what = middle ? std::string(dtype_name(static_cast<DType>(middle - 1))) : "bytes";
    if (o) what += " " + to_string(static_cast<ReduceOp>(o - 1));
    static const char* const names[] = {
        "?", "an allreduce", "a reduce-scatter", "an all-gather", "a broadcast", "a barrier"};
    return what + " in " + names[std::min<uint64_t>(kind_of, 5)] + " (collective #" +
           std::to_string(k >> 32) + ")";
  };
  return {op, static_cast<uint64_t>(count), kind, describe, timeout};
}

// AVG's division of reduced elements, done through shared memory by the rank that reduces
// them (null: nothing to finish).
template <typename T>
FinishFunction finish_function(ReduceOp op) {
  if constexpr (std::is_floating_point_v<T>)
    if (op == ReduceOp::AVG)
      return [](void* data, size_t n, int size) {
        ProcessGroup::divide(static_cast<T*>(data), n, size);
      };
  return nullptr;
}

}  // namespace

void allreduce_in_place_now(const char* name, const Transport& via, std::span<const Tensor> tensors,
                            ReduceOp op, uint32_t tag, Milliseconds timeout) {
  GW_CHECK(via.shm != nullptr && !tensors.empty(), InternalError, "[", name,
           "] in place through shared memory only, of one tensor at least");
  const DType dtype = tensors[0].dtype();
  SmallVector<Piece, 4> pieces;
  int64_t count = 0;
  for (const Tensor& t : tensors) {
    pieces.push_back({t.raw_data(), t.nbytes()});
    count += t.numel();
  }
  dispatch_reduce(dtype, op, name, [&]<typename T>() {
    via.shm->allreduce(shm_call(name, ShmKind::kAllreduce, tag, dtype, op, count, timeout),
                       {pieces.data(), pieces.size()}, sizeof(T), reduce_function<T>(op),
                       finish_function<T>(op));
  });
}

// An allreduce of `t` on the group's thread (the body of the reducing collectives).
void allreduce_now(const char* name, const Transport& via, const Tensor& t, ReduceOp op,
                   uint32_t tag, Milliseconds timeout) {
  if (via.shm) return allreduce_in_place_now(name, via, {&t, 1}, op, tag, timeout);
  if (t.numel() == 0) return;
  const std::shared_ptr<gloo::Context>& context = via.context;
  dispatch_reduce(t.dtype(), op, name, [&]<typename T>() {
    gloo::AllreduceOptions g(context);
    g.setOutput<T>(static_cast<T*>(t.raw_data()), static_cast<size_t>(t.numel()));
    g.setReduceFunction(reduce_function<T>(op));
    g.setTag(tag);
    g.setTimeout(timeout);
    gloo::allreduce(g);
  });
  if (op == ReduceOp::AVG) ProcessGroup::divide(t, context->size, "allreduce");
}

// An allgather of `input` into `output` (size() chunks like it), on the group's thread.
void allgather_now(const char* name, const Transport& via, const Tensor& input,
                   const Tensor& output, uint32_t tag, Milliseconds timeout) {
  if (via.shm) {
    return via.shm->all_gather(shm_call(name, ShmKind::kAllGather, tag, std::nullopt, std::nullopt,
                                        static_cast<int64_t>(input.nbytes()), timeout),
                               input.raw_data(), output.raw_data());
  }
  if (input.nbytes() == 0) return;
  const std::shared_ptr<gloo::Context>& context = via.context;
  gloo::AllgatherOptions g(context);
  g.setInput<uint8_t>(bytes_of(input), input.nbytes());
  g.setOutput<uint8_t>(bytes_of(output), output.nbytes());
  g.setTag(tag);
  g.setTimeout(timeout);
  gloo::allgather(g);
}

// Our reduce-scatter's slots (Gloo's own collectives use prefixes 0x01-0x08).
constexpr uint8_t kReduceScatterSlotPrefix = 0x0a;

// A ring reduce-scatter of `input` (size chunks) into `output` (rank's chunk), on the group's
// thread. Gloo has none for these buffers (PyTorch runs an allreduce per rank), so it is built
// on Gloo's transport: in size-1 steps every rank passes a partial result to its right and adds
// its own chunk to the partial arriving from its left; the partial that arrives last is its own
// chunk, reduced over every rank. Each rank sends and receives (size-1)/size of the buffer, half
// of an allreduce's traffic, and `input` is only read.
void reduce_scatter_now(const char* name, const Transport& via, const Tensor& input,
                        const Tensor& output, ReduceOp op, uint32_t tag, Milliseconds timeout) {
  if (via.shm) {
    dispatch_reduce(output.dtype(), op, name, [&]<typename T>() {
      via.shm->reduce_scatter(
          shm_call(name, ShmKind::kReduceScatter, tag, output.dtype(), op, output.numel(), timeout),
          input.raw_data(), output.raw_data(), sizeof(T), reduce_function<T>(op),
          finish_function<T>(op));
    });
    return;
  }
  const std::shared_ptr<gloo::Context>& context = via.context;
  const size_t bytes = output.nbytes();
  if (bytes == 0) return;
  const int n = context->size;
  const int rank = context->rank;
  const uint8_t* in = bytes_of(input);
  if (n == 1) {
    std::memcpy(bytes_of(output), in, bytes);
    return;
  }
  dispatch_reduce(output.dtype(), op, "reduce_scatter", [&]<typename T>() {
    const ReduceFunction reduce = reduce_function<T>(op);
    const size_t count = bytes / sizeof(T);
    // What arrives, then the two partials passed on in turn (one is sent while the other fills).
    Tensor scratch = empty({3 * output.numel()}, TensorOptions().with_dtype(output.dtype()));
    uint8_t* arriving = bytes_of(scratch);
    uint8_t* partial[2] = {arriving + bytes, arriving + 2 * bytes};
    auto chunk = [&](int c) { return const_cast<uint8_t*>(in) + static_cast<size_t>(c) * bytes; };
    auto wrap = [n](int c) { return ((c % n) + n) % n; };
    auto receiving = context->createUnboundBuffer(arriving, bytes);
    std::unique_ptr<gloo::transport::UnboundBuffer> outgoing[2] = {
        context->createUnboundBuffer(partial[0], bytes),
        context->createUnboundBuffer(partial[1], bytes)};
    // Step 0 passes on this rank's own chunk rank-1 as it is.
    auto first = context->createUnboundBuffer(chunk(wrap(rank - 1)), bytes);
    gloo::transport::UnboundBuffer* sending = first.get();
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int right = wrap(rank + 1);
    const int left = wrap(rank - 1);
    for (int step = 0; step < n - 1; ++step) {
      receiving->recv(left, slot);
      sending->send(right, slot);
      GW_CHECK(receiving->waitRecv(timeout), IoError, "[reduce_scatter] rank ", rank,
               ": the receive from rank ", left, " was aborted");
      // The partial of chunk rank-step-2 arrived: add ours and pass it on (or keep it: the last
      // one is chunk `rank`).
      const bool last = step == n - 2;
      uint8_t* reduced = last ? bytes_of(output) : partial[step % 2];
      reduce(reduced, chunk(wrap(rank - step - 2)), arriving, count);
      GW_CHECK(sending->waitSend(timeout), IoError, "[reduce_scatter] rank ", rank,
               ": the send to rank ", right, " was aborted");
      sending = outgoing[step % 2].get();
    }
  });
  if (op == ReduceOp::AVG) ProcessGroup::divide(output, n, "reduce_scatter");
}

void broadcast_now(const Transport& via, const Tensor& t, int root, uint32_t tag,
                   Milliseconds timeout) {
  if (via.shm) {
    return via.shm->broadcast(
        shm_call("broadcast", ShmKind::kBroadcast, tag, std::nullopt, std::nullopt,
                 static_cast<int64_t>(t.nbytes()), timeout, root),
        t.raw_data(), root);
  }
  if (t.nbytes() == 0) return;
  gloo::BroadcastOptions g(via.context);
  g.setOutput<uint8_t>(bytes_of(t), t.nbytes());
  g.setRoot(root);
  g.setTag(tag);
  g.setTimeout(timeout);
  gloo::broadcast(g);
}

void barrier_now(const Transport& via, uint32_t tag, Milliseconds timeout) {
  if (via.shm) {
    return via.shm->barrier(
        shm_call("barrier", ShmKind::kBarrier, tag, std::nullopt, std::nullopt, 0, timeout));
  }
  gloo::BarrierOptions g(via.context);
  g.setTag(tag);
  g.setTimeout(timeout);
  gloo::barrier(g);
}

}  // namespace gw::dist::detail
