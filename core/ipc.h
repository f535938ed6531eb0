// CUDA tensors handed to another process on this host by reference (CUDA IPC) rather than
// through host memory: how RPC moves a CUDA tensor between two workers on one machine.
//
// The sender copies the tensor device to device into a block of its own (a snapshot: the
// caller may write the tensor again at once, as after a copy to the host), waits for that copy,
// and shares the block's IPC handle. It keeps the block in a lease until the receiver says it
// has its own copy. The receiver opens the handle (once per block: mappings are cached), copies
// device to device into a new tensor, and waits for that copy before the lease goes back. The
// bytes never leave the GPU.
//
//   sender:                                         receiver:
//     CudaIpcLease lease;
//     SharedCudaTensor s = share_cuda_tensor(t, lease);
//     ... send s, keep `lease` ...   ------------->   Tensor mine = import_cuda_tensor(s, dtype,
//                                                         sizes, 0, sender_pid);
//     ... drop `lease`               <-------------   ... tell the sender it may ...
//
// In a build without CUDA nothing can be shared: cuda_ipc_shareable() is false.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"

namespace gw {

// What travels instead of the bytes.
struct SharedCudaTensor {
  std::array<uint8_t, 64> memory{};  // cudaIpcMemHandle_t of the allocation holding the tensor
  uint64_t offset = 0;               // of the tensor's first byte in that allocation
};

// What a sender keeps until the receiver has copied: the snapshots it shared. Movable;
// dropping it lets their blocks be reused.
class CudaIpcLease {
 public:
  CudaIpcLease();
  ~CudaIpcLease();
  CudaIpcLease(CudaIpcLease&&) noexcept;
  CudaIpcLease& operator=(CudaIpcLease&&) noexcept;
  bool empty() const { return tensors_.empty(); }

 private:
  friend SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease& lease);
  std::vector<Tensor> tensors_;
};

// Whether `t` can be shared: CUDA is built in, GW_RPC_CUDA_IPC is not 0, and `t` lives in
// device memory of this process (not host memory labelled as a device).
bool cuda_ipc_shareable(const Tensor& t);
// Snapshots a CUDA tensor for which cuda_ipc_shareable holds and shares the snapshot, which
// `lease` keeps. Waits for the snapshot (so for the work queued before it on the current
// stream). Throws CudaError when the snapshot cannot be made or shared (out of memory, say).
SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease& lease);

// A process that tensors were shared with, watched from while it is known to be alive (a
// pidfd), so that its end is seen even if its pid is reused later.
class CudaIpcPeer {
 public:
  explicit CudaIpcPeer(int64_t pid);
  ~CudaIpcPeer();
  CudaIpcPeer(const CudaIpcPeer&) = delete;
  CudaIpcPeer& operator=(const CudaIpcPeer&) = delete;
  int64_t pid() const { return pid_; }
  bool gone() const;

 private:
  int64_t pid_;
  int pidfd_;            // -1 where pidfds are not available: then kill(pid, 0) says
  bool exited_ = false;  // already when watched
};
// Keeps `leases` until `peer` is gone: for a sender that cannot know whether that receiver
// still copies (its connection closed before the receiver said it was done).
void keep_cuda_ipc_leases_until_gone(std::vector<CudaIpcLease> leases,
                                     std::shared_ptr<const CudaIpcPeer> peer);

// A new tensor on cuda:`device` with the shared tensor's bytes, copied device to device; the
// copy is complete when this returns. `s` comes from another process: its memory must hold
// offset + numel(sizes) * itemsize(dtype) bytes, or this throws IoError; so does a handle the
// driver cannot open. `sender` names that process (its pid) for forget_cuda_ipc_sender.
Tensor import_cuda_tensor(const SharedCudaTensor& s, DType dtype, const Shape& sizes, int device,
                          int64_t sender);
// Closes the mappings opened from `sender` and cached (imports under way keep theirs): a
// process that is gone cannot free its memory while another keeps it mapped.
void forget_cuda_ipc_sender(int64_t sender);

// Counts since the process started, for tests and benchmarks.
struct CudaIpcStats {
  uint64_t shared = 0;          // tensors shared by share_cuda_tensor
  uint64_t imported = 0;        // tensors copied by import_cuda_tensor
  uint64_t leases_held = 0;     // non-empty leases alive now
  uint64_t handles_mapped = 0;  // other processes' memory handles open here now
};
CudaIpcStats cuda_ipc_stats();

}  // namespace gw
