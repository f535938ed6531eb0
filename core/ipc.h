// CUDA tensors handed to another process on this host by reference (CUDA IPC) rather than
// through host memory: how RPC moves a CUDA tensor between two workers on one machine.
//
// The sender shares the device memory that holds the tensor and an event recorded on its current
// stream after the tensor's last write, and keeps both alive in a lease until the receiver says it
// has its own copy. The receiver opens the two (once per memory block and event: they are cached),
// makes its copy wait for the event on its current stream, copies device to device, and waits
// for that copy before the lease goes back. The bytes never leave the GPU.
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
  std::array<uint8_t, 64> event{};   // cudaIpcEventHandle_t, recorded after its last write
};

// What a sender keeps until the receiver has copied: the shared tensors (their memory) and
// their events. Movable; dropping it releases them.
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
  std::vector<std::shared_ptr<void>> events_;  // back to their pool when released
};

// Whether `t` can be shared: CUDA is built in and `t` lives in device memory of this process's
// allocations (not host memory labelled as a device).
bool cuda_ipc_shareable(const Tensor& t);
// Shares a contiguous CUDA tensor for which cuda_ipc_shareable holds, adding what must stay
// alive to `lease`. Throws CudaError when the driver refuses.
SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease& lease);
// A new tensor on cuda:`device` with the shared tensor's bytes, copied device to device once the
// sender's event has fired; the copy is complete when this returns. `s` comes from another
// process: its memory must hold offset + numel(sizes) * itemsize(dtype) bytes, or this throws
// IoError; so does a handle the driver cannot open. `sender` names that process (its pid) for
// forget_cuda_ipc_sender.
Tensor import_cuda_tensor(const SharedCudaTensor& s, DType dtype, const Shape& sizes, int device,
                          int64_t sender);
// Closes the memory and events opened from `sender` and cached (imports under way keep theirs):
// a process that is gone cannot free its memory while another keeps it mapped.
void forget_cuda_ipc_sender(int64_t sender);

// Counts since the process started, for tests and benchmarks.
struct CudaIpcStats {
  uint64_t shared = 0;          // tensors shared by share_cuda_tensor
  uint64_t imported = 0;        // tensors copied by import_cuda_tensor
  uint64_t leases_held = 0;     // non-empty leases alive now
  uint64_t handles_opened = 0;  // memory handles the driver opened (the rest came from the cache)
  uint64_t handles_mapped = 0;  // of those, still open now
};
CudaIpcStats cuda_ipc_stats();

}  // namespace gw
