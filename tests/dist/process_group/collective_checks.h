// Every collective of a process group against values computed locally, run by each rank of a
// group, whether the ranks are threads (test_process_group) or processes (pg_peer and
// test_pg_multiprocess), on the group's device: CPU tensors (Gloo) or CUDA ones (NCCL,
// test_nccl). Rank r contributes values(r, ...), so every result is predictable; results are
// compared on the CPU.
#pragma once

#include "core/ops.h"
#include "dist/process_group/process_group.h"
#include "tests/dist/process_group/checks.h"

namespace gw::dist::testing {

// Rank r's tensor of a case: values that differ per rank and per element.
inline Tensor values(int r, DType dtype, int64_t n = 5, Device device = kCPU) {
  return (arange(n, kFloat64) + (r + 1) * 10.0 + 1.0).to(dtype).to(device);
}
inline Tensor on_cpu(const Tensor& t) { return t.to(kCPU); }
inline Tensor blank(Shape shape, DType dtype, Device device) {
  return empty(std::move(shape), TensorOptions(dtype).with_device(device));
}

inline Tensor expected(ReduceOp op, int world, DType dtype, int64_t n = 5) {
  Tensor acc = values(0, kFloat64, n);
  for (int r = 1; r < world; ++r) {
    Tensor v = values(r, kFloat64, n);
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG:
        acc = acc + v;
        break;
      case ReduceOp::PRODUCT:
        acc = acc * v;
        break;
      case ReduceOp::MIN:
        acc = minimum(acc, v);
        break;
      case ReduceOp::MAX:
        acc = maximum(acc, v);
        break;
    }
  }
  if (op == ReduceOp::AVG) acc = acc / static_cast<double>(world);
  return acc.to(dtype);
}

inline void check_allreduce(ProcessGroup& pg, Checks& c) {
  const Device dev = pg.device();
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64})
    for (ReduceOp op :
         {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
      if (op == ReduceOp::AVG && !is_floating(dtype)) continue;
      Tensor t = values(pg.rank(), dtype, 5, dev);
      pg.allreduce(t, {.op = op})->wait();
      c.expect(allclose(on_cpu(t).to(kFloat64), expected(op, pg.size(), dtype).to(kFloat64)),
               gw::detail::str("allreduce world ", pg.size(), " ", dtype_name(dtype), " ",
                               to_string(op)));
    }
}

// The rooted collectives from every root, and allgather.
inline void check_rooted(ProcessGroup& pg, Checks& c) {
  const Device dev = pg.device();
  const int r = pg.rank(), world = pg.size();
  for (int root = 0; root < world; ++root) {
    Tensor b = values(r, kFloat32, 5, dev);
    pg.broadcast(b, {.root = root})->wait();
    EXPECT(c, equal(on_cpu(b), values(root, kFloat32)));

    Tensor red = values(r, kInt64, 5, dev);
    pg.reduce(red, {.root = root, .op = ReduceOp::SUM})->wait();
    EXPECT(c, equal(on_cpu(red), r == root ? expected(ReduceOp::SUM, world, kInt64)
                                           : values(r, kInt64)));  // others keep theirs

    std::vector<Tensor> gathered;
    if (r == root)
      for (int i = 0; i < world; ++i) gathered.push_back(blank({5}, kFloat64, dev));
    pg.gather(gathered, values(r, kFloat64, 5, dev), {.root = root})->wait();
    for (int i = 0; i < static_cast<int>(gathered.size()); ++i)
      EXPECT(c, equal(on_cpu(gathered[i]), values(i, kFloat64)));

    std::vector<Tensor> parts;
    if (r == root)
      for (int i = 0; i < world; ++i) parts.push_back(values(100 + i, kInt32, 5, dev));
    Tensor mine = blank({5}, kInt32, dev);
    pg.scatter(mine, parts, {.root = root})->wait();
    EXPECT(c, equal(on_cpu(mine), values(100 + r, kInt32)));
  }
  std::vector<Tensor> all;
  for (int i = 0; i < world; ++i) all.push_back(blank({2, 3}, kFloat32, dev));
  pg.allgather(all, values(r, kFloat32, 6, dev).reshape({2, 3}))->wait();
  for (int i = 0; i < world; ++i)
    EXPECT(c, equal(on_cpu(all[i]), values(i, kFloat32, 6).reshape({2, 3})));
}

// reduce_scatter, alltoall, the coalesced allreduce, barrier, and a ring of send/recv.
inline void check_exchanges(ProcessGroup& pg, Checks& c) {
  const Device dev = pg.device();
  const int r = pg.rank(), world = pg.size();
  // reduce_scatter: rank r gets the sum over ranks of their inputs[r].
  std::vector<Tensor> inputs;
  for (int i = 0; i < world; ++i) inputs.push_back(values(r * 10 + i, kFloat64, 5, dev));
  Tensor out = blank({5}, kFloat64, dev);
  pg.reduce_scatter(out, inputs)->wait();
  Tensor want = zeros({5}, kFloat64);
  for (int s = 0; s < world; ++s) want = want + values(s * 10 + r, kFloat64);
  EXPECT(c, allclose(on_cpu(out), want));

  // The flat forms, on chunk sizes that do not divide evenly into anything, with every reduce
  // op: rank r contributes chunk i = values(r * 10 + i); output = op over ranks of chunk r.
  for (int64_t n : {1, 7, 1001})
    for (DType dtype : {kFloat32, kFloat64, kInt64})
      for (ReduceOp op :
           {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
        if (op == ReduceOp::AVG && !is_floating(dtype)) continue;
        if (op == ReduceOp::PRODUCT && n > 7) continue;  // overflows
        std::vector<Tensor> chunks;
        for (int i = 0; i < world; ++i) chunks.push_back(values(r * 10 + i, dtype, n));
        Tensor whole = cat(chunks, 0).to(dev);
        Tensor mine = blank({n}, dtype, dev);
        pg.reduce_scatter_tensor(mine, whole, {.op = op})->wait();
        Tensor acc = values(r, kFloat64, n);  // rank 0's chunk r
        for (int s = 1; s < world; ++s) {
          Tensor v = values(s * 10 + r, kFloat64, n);
          acc = op == ReduceOp::PRODUCT ? acc * v
                : op == ReduceOp::MIN   ? minimum(acc, v)
                : op == ReduceOp::MAX   ? maximum(acc, v)
                                        : acc + v;
        }
        if (op == ReduceOp::AVG) acc = acc / static_cast<double>(world);
        c.expect(allclose(on_cpu(mine).to(kFloat64), acc.to(dtype).to(kFloat64)),
                 gw::detail::str("reduce_scatter_tensor world ", world, " n ", n, " ",
                                 dtype_name(dtype), " ", to_string(op)));
        EXPECT(c, equal(on_cpu(whole), cat(chunks, 0)));  // the input is only read

        Tensor gathered = blank({world * n}, dtype, dev);
        pg.all_gather_into_tensor(gathered, values(r, dtype, n, dev))->wait();
        for (int i = 0; i < world; ++i)
          EXPECT(c, equal(on_cpu(gathered).narrow(0, i * n, n), values(i, dtype, n)));
      }
  // A whole buffer that does not hold world chunks is refused before anything is sent.
  Tensor wrong = blank({world * 5 + 1}, kFloat32, dev);
  Tensor part = blank({5}, kFloat32, dev);
  EXPECT_THROWS(c, InvalidArgumentError, pg.reduce_scatter_tensor(part, wrong),
                "[reduce_scatter_tensor]", "chunks");
  EXPECT_THROWS(c, InvalidArgumentError, pg.all_gather_into_tensor(wrong, part),
                "[all_gather_into_tensor]", "chunks");

  // alltoall: outputs[j] is what rank j sent to this rank.
  std::vector<Tensor> send_parts, recv_parts;
  for (int i = 0; i < world; ++i) {
    send_parts.push_back(values(r * 10 + i, kInt64, 5, dev));
    recv_parts.push_back(blank({5}, kInt64, dev));
  }
  pg.alltoall(recv_parts, send_parts)->wait();
  for (int j = 0; j < world; ++j)
    EXPECT(c, equal(on_cpu(recv_parts[j]), values(j * 10 + r, kInt64)));

  // Several tensors of different shapes reduced as one buffer.
  std::vector<Tensor> many{values(r, kFloat32, 3, dev),
                           values(r, kFloat32, 7, dev).reshape({7, 1})};
  pg.allreduce_coalesced(many)->wait();
  EXPECT(c, allclose(on_cpu(many[0]), expected(ReduceOp::SUM, world, kFloat32, 3)));
  EXPECT(c, allclose(on_cpu(many[1]), expected(ReduceOp::SUM, world, kFloat32, 7).reshape({7, 1})));

  pg.barrier()->wait();
  if (world == 1) return;  // nobody to send to

  // A ring of send/recv, both posted before either is waited for; odd ranks receive first,
  // since NCCL runs them in call order and a ring of sends first would wait for itself.
  Tensor got = blank({5}, kFloat32, dev);
  WorkPtr sent, received;
  if (r % 2 == 1) received = pg.recv(got, (r + world - 1) % world, 7);
  sent = pg.send(values(r, kFloat32, 5, dev), (r + 1) % world, /*tag=*/7);
  if (r % 2 == 0) received = pg.recv(got, (r + world - 1) % world, 7);
  sent->wait();
  received->wait();
  EXPECT(c, equal(on_cpu(got), values((r + world - 1) % world, kFloat32)));
  EXPECT(c, sent->is_success());
}

inline void check_every_collective(ProcessGroup& pg, Checks& c) {
  check_allreduce(pg, c);
  check_rooted(pg, c);
  check_exchanges(pg, c);
}

}  // namespace gw::dist::testing
