// The rest of torch.distributed's collective API that PyTorch users reach for, built on a
// ProcessGroup's own collectives (every backend has them): the default group's rank and size,
// all_to_all_single with even or uneven splits, batch_isend_irecv, and byte buffers of any length
// broadcast or gathered from every rank (broadcast_object_list / all_gather_object, for
// metadata: serialize with whatever you like).
//
//   const int rank = gw::dist::get_rank();
//   // Two ranks: rank r sends r + d + 1 rows to rank d, and receives d + r + 1 from each d.
//   gw::dist::all_to_all_single(*pg, output, input, {r + 1, r + 2}, {r + 1, r + 2});
//   auto works = gw::dist::batch_isend_irecv(*pg, {{gw::dist::P2POp::kSend, t, (rank + 1) % n},
//                                                  {gw::dist::P2POp::kRecv, u, (rank + n - 1) %
//                                                  n}});
//   for (auto& w : works) w->wait();
//   auto names = gw::dist::all_gather_bytes(*pg, my_name_bytes);  // one buffer per rank
//
// The helpers that return nothing wait for their collectives (PyTorch's async_op=False); each is
// a collective of `group`: every rank calls it, in the same order as the others.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/process_group/process_group.h"

namespace gw::dist {

// The default group's rank and size (torch.distributed.get_rank / get_world_size); StateError
// when init_process_group was not called.
int get_rank();
int get_world_size();

// `input`'s rows (dim 0) cut into size() consecutive chunks of input_split_sizes rows, chunk i
// sent to rank i; `output` receives rank j's chunk for this rank as its j-th chunk of
// output_split_sizes rows. Empty split sizes: equal chunks (the rows divide by size()). The
// ranks first gather each other's sizes, so that every rank raises the same
// InvalidArgumentError when any rank's sizes do not add up, its rows differ, or a rank sends
// other than what its receiver expects. Not differentiable (the input is read detached).
// Uneven splits travel padded to the largest chunk of any rank.
void all_to_all_single(ProcessGroup& group, Tensor& output, const Tensor& input,
                       const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {});

// One point-to-point operation of a batch (torch.distributed.P2POp).
struct P2POp {
  enum Kind { kSend, kRecv };
  Kind kind;
  Tensor tensor;
  int peer;
  int tag = 0;
};
// Checks every operation, then starts them all, so that a ring of sends and receives cannot
// deadlock; the works, in the order of `ops`. Gloo and MPI groups (NCCL's would need its
// sends and receives grouped: refused for now).
std::vector<WorkPtr> batch_isend_irecv(ProcessGroup& group, const std::vector<P2POp>& ops);

// `bytes` of rank `root`, on every rank (the others' argument is ignored).
std::vector<uint8_t> broadcast_bytes(ProcessGroup& group, const std::vector<uint8_t>& bytes,
                                     int root);
// Every rank's `bytes`, by rank.
std::vector<std::vector<uint8_t>> all_gather_bytes(ProcessGroup& group,
                                                   const std::vector<uint8_t>& bytes);

}  // namespace gw::dist
