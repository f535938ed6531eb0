#include "core/ipc.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/ipc_cache.h"
#include "core/ops.h"
#include "core/trace.h"

#ifdef GW_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <optional>

#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#endif

namespace gw {

namespace {
std::atomic<uint64_t> g_shared{0}, g_imported{0}, g_leases_held{0}, g_handles_mapped{0};

// Leases kept for receivers that may still copy, until their process is gone. Reaped whenever
// something is shared or kept. Leaked: leases may be dropped by threads that outlive static
// destruction.
class KeptLeases {
 public:
  void keep(std::vector<CudaIpcLease> leases, std::shared_ptr<const CudaIpcPeer> peer) {
    reap();
    if (leases.empty() || peer->gone()) return;
    std::lock_guard lock(mu_);
    kept_.push_back({std::move(peer), std::move(leases)});
  }

  void reap() {
    std::vector<Kept> gone;  // dropped outside the lock
    std::lock_guard lock(mu_);
    std::erase_if(kept_, [&](Kept& k) {
      if (!k.peer->gone()) return false;
      gone.push_back(std::move(k));
      return true;
    });
  }

 private:
  struct Kept {
    std::shared_ptr<const CudaIpcPeer> peer;
    std::vector<CudaIpcLease> leases;
  };
  std::mutex mu_;
  std::vector<Kept> kept_;
};

KeptLeases& kept_leases() {
  static auto* kept = new KeptLeases;
  return *kept;
}
}  // namespace

CudaIpcStats cuda_ipc_stats() {
  return {g_shared.load(), g_imported.load(), g_leases_held.load(), g_handles_mapped.load()};
}

CudaIpcLease::CudaIpcLease() = default;
CudaIpcLease::~CudaIpcLease() {
  if (!empty()) --g_leases_held;
}
CudaIpcLease::CudaIpcLease(CudaIpcLease&& o) noexcept : tensors_(std::exchange(o.tensors_, {})) {}
CudaIpcLease& CudaIpcLease::operator=(CudaIpcLease&& o) noexcept {
  if (this != &o) {
    if (!empty()) --g_leases_held;
    tensors_ = std::exchange(o.tensors_, {});
  }
  return *this;
}

CudaIpcPeer::CudaIpcPeer(int64_t pid)
    : pid_(pid), pidfd_(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0))) {
  exited_ = pidfd_ < 0 && errno == ESRCH;
}

CudaIpcPeer::~CudaIpcPeer() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool CudaIpcPeer::gone() const {
  if (exited_) return true;
  if (pidfd_ < 0) return ::kill(static_cast<pid_t>(pid_), 0) != 0 && errno == ESRCH;
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;  // readable once the process has exited
}

void keep_cuda_ipc_leases_until_gone(std::vector<CudaIpcLease> leases,
                                     std::shared_ptr<const CudaIpcPeer> peer) {
  kept_leases().keep(std::move(leases), std::move(peer));
}

#ifndef GW_HAVE_CUDA

bool cuda_ipc_shareable(const Tensor&) { return false; }

SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease&) {
  throw InvalidArgumentError(detail::str("[share_cuda_tensor] a tensor on ", t.device(),
                                         ": this build has no CUDA backend"));
}

Tensor import_cuda_tensor(const SharedCudaTensor&, DType, const Shape&, int device, int64_t) {
  throw IoError(detail::str("[import_cuda_tensor] a tensor for cuda:", device,
                            ": this build has no CUDA backend"));
}

void forget_cuda_ipc_sender(int64_t) {}

#else

namespace {

// The allocation that holds `ptr` (base and size), through the driver's cuMemGetAddressRange:
// none for memory that is not the device's (host memory labelled as a device, say).
std::optional<std::pair<char*, size_t> > allocation_of(const void* ptr) {
  using AddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const AddressRange address_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t status = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                                cudaEnableDefault, &found);
#else
    const cudaError_t status =
        cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &found);
#endif
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cuda::clear_last_error();
      return AddressRange{nullptr};
    }
    return reinterpret_cast<AddressRange>(fn);
  }();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!address_range ||
      address_range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return std::nullopt;
  return std::pair{reinterpret_cast<char*>(base), size};
}

// The CUDA driver's side of the receiver's mappings (core/ipc_cache.h).
detail::IpcMappingCache::Opened open_mapping(const detail::IpcMappingCache::Handle& h, int device) {
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, h.data(), sizeof handle);
  void* ptr = nullptr;
  const cudaError_t status = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  if (status != cudaSuccess) {
    cuda::clear_last_error();
    throw IoError(
        detail::str("[import_cuda_tensor] cannot open the sender's memory handle on cuda:", device,
                    ": ", cudaGetErrorString(status),
                    " (GW_RPC_CUDA_IPC=0 on the sender stages CUDA tensors through host "
                    "memory instead)"));
  }
  const auto range = allocation_of(ptr);
  if (!range || range->first != ptr) {
    if (cudaIpcCloseMemHandle(ptr) != cudaSuccess) cuda::clear_last_error();
    throw IoError("[import_cuda_tensor] the driver does not say how large the sender's memory is");
  }
  ++g_handles_mapped;
  return {static_cast<char*>(ptr), range->second};
}

void close_mapping(char* base, int device) {
  try {
    cuda::DeviceGuard guard(device);
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) cuda::clear_last_error();
    --g_handles_mapped;
  } catch (const std::exception&) {  // the device is unusable: its context holds the mapping
  }
}

detail::IpcMappingCache& imports() {
  // Leaked, as kept_leases(): copies may let go from threads that outlive static destruction.
  static auto* cache = new detail::IpcMappingCache({open_mapping, close_mapping});
  return *cache;
}

}  // namespace

bool cuda_ipc_shareable(const Tensor& t) {
  static const bool off = [] {
    const char* v = std::getenv("GW_RPC_CUDA_IPC");
    return v != nullptr && std::string_view(v) == "0";
  }();
  if (off || !t.device().is_cuda() || t.nbytes() == 0) return false;
  cuda::DeviceGuard guard(t.device().index);
  return allocation_of(t.raw_data()).has_value();
}

SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease& lease) {
  GW_CHECK(t.device().is_cuda(), InvalidArgumentError,
           "[share_cuda_tensor] needs a CUDA tensor, got one on ", t.device());
  kept_leases().reap();
  const int device = t.device().index;
  cuda::DeviceGuard guard(device);
  Tensor snapshot = t.detach().clone();
  GW_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream(device)));
  char* data = static_cast<char*>(snapshot.raw_data());
  const auto range = allocation_of(data);
  GW_CHECK(range, InvalidArgumentError, "[share_cuda_tensor] the tensor on ", t.device(),
           " is not in device memory of this process");
  cudaIpcMemHandle_t memory;
  GW_CUDA_CHECK(cudaIpcGetMemHandle(&memory, range->first));
  SharedCudaTensor s;
  static_assert(sizeof memory == sizeof s.memory);
  std::memcpy(s.memory.data(), &memory, sizeof memory);
  s.offset = static_cast<uint64_t>(data - range->first);
  if (lease.empty()) ++g_leases_held;
  lease.tensors_.push_back(std::move(snapshot));
  ++g_shared;
  return s;
}

Tensor import_cuda_tensor(const SharedCudaTensor& s, DType dtype, const Shape& sizes, int device,
                          int64_t sender) {
  cuda::check_device(cuda_device(device), "import_cuda_tensor");
  cuda::DeviceGuard guard(device);
  trace::Scope span("cuda", "import_cuda_tensor");
  const detail::IpcMappingCache::Held memory = imports().hold(s.memory, device, sender);
  const size_t nbytes = static_cast<size_t>(numel(sizes)) * itemsize(dtype);
  GW_CHECK(s.offset <= memory->size && nbytes <= memory->size - s.offset, IoError,
           "[import_cuda_tensor] ", nbytes, " bytes at offset ", s.offset,
           " lie outside the sender's allocation of ", memory->size, " bytes");
  Tensor out = empty(sizes, TensorOptions(dtype).with_device(cuda_device(device)));
  if (nbytes == 0) return out;
  cudaStream_t stream = cuda::current_stream(device);
  GW_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), memory->base + s.offset, nbytes,
                                cudaMemcpyDeviceToDevice, stream));
  // The sender may reuse the memory as soon as it hears back: the copy must be over by then.
  GW_CUDA_CHECK(cudaStreamSynchronize(stream));
  ++g_imported;
  return out;
}

void forget_cuda_ipc_sender(int64_t sender) { imports().forget(sender); }

#endif

}  // namespace gw
